"""Triton kernels of iqtrain.

The sources live in the repository's top-level ``kernels/`` directory; each module here is a file
symlink to one of them (maturin follows file symlinks and skips directory ones), so the installed
wheel carries them under the ``iqtrain`` namespace, e.g. ``iqtrain.kernels.normalize_patch``.

Nothing is imported here: importing a kernel module imports triton, and ``iqtrain`` must stay
importable on machines without triton (the PyTorch reference paths need none).
"""
