"""``python -m iqtrain``: the same command as ``iqtrain`` (what ``torchrun -m iqtrain`` runs)."""

import sys

from iqtrain.cli import main

sys.exit(main())
