"""``python -m iqtrain``: the same command as ``iqtrain`` (what ``torchrun -m iqtrain`` runs)."""

import sys

from iqtrain.cli.main import main

sys.exit(main())
