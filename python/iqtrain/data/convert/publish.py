"""A new directory, all or nothing: ``OUT_DIR`` of ``iqtrain convert``.

:func:`check_out_dir` before the source is read: ``OUT_DIR`` absent or an empty directory that
a new directory can be renamed onto (not a symbolic link, not a mount point), whose temporary
sibling ``OUT_DIR.tmp-<pid>`` can be created. :func:`publish` writes into that sibling, fsyncs
it and renames it onto ``OUT_DIR``; any failure (a full disk, a bad row found in the middle, a
signal) removes it and the parents made for it, and leaves no ``OUT_DIR``. Imports no torch.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from iqtrain.data.convert.checks import one_line
from iqtrain.errors import ConfigError
from iqtrain.storage import creatable_dir, discard_dir, fsync_dir, missing_dirs, storage_error

__all__ = ["check_out_dir", "publish", "tmp_dir"]

_T = TypeVar("_T")


def tmp_dir(out: Path) -> Path:
    """Where :func:`publish` writes ``out`` before renaming it: ``OUT_DIR.tmp-<pid>``."""
    return out.with_name(f"{out.name}.tmp-{os.getpid()}")


def check_out_dir(out_dir: object) -> Path:
    """``out_dir`` made absolute: absent or an empty directory that a new directory can be
    renamed onto, whose temporary sibling (:func:`tmp_dir`) can be created: all of it checked
    before the source is read, so no conversion fails at its end for the want of a place."""
    if not isinstance(out_dir, str | os.PathLike):
        raise TypeError(f"out_dir: must be a path, got {out_dir!r}")
    out = Path(os.path.abspath(out_dir))
    try:
        st = os.lstat(out)
    except (FileNotFoundError, NotADirectoryError):  # absent; creatable_dir says what is wrong
        pass
    except OSError as exc:  # a parent that is a symlink loop, a name too long
        raise ConfigError(f"{out}: cannot be created: {one_line(exc)}") from None
    else:
        _check_existing_out(out, st)
    why = creatable_dir(tmp_dir(out))
    if why is not None:
        raise ConfigError(f"{out}: cannot be created: {why}")
    return out


def _check_existing_out(out: Path, st: os.stat_result) -> None:
    """An ``out`` that exists must be an empty directory the new one can be renamed onto
    (rename(2) replaces neither a symbolic link by a directory nor a mount point)."""
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{out}: is a symbolic link (convert renames a new directory onto OUT_DIR; name "
            "the directory itself)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{out}: exists and is not a directory")
    try:
        empty = not any(out.iterdir())
    except OSError as exc:
        raise ConfigError(f"{out}: cannot read: {one_line(exc)}") from None
    if not empty:
        raise ConfigError(f"{out}: exists and is not empty (convert writes a new directory)")
    if os.path.ismount(out):
        raise ConfigError(
            f"{out}: is a mount point (convert renames a new directory onto OUT_DIR, which "
            "cannot replace a mount point; name a directory inside it)"
        )


def publish(out: Path, write: Callable[[Path], _T]) -> _T:
    """``write(tmp)`` into a fresh ``OUT_DIR.tmp-<pid>``, then renamed to ``out``; on any failure
    the temporary directory (and the parents made for it) are removed and ``out`` stays absent."""
    tmp = tmp_dir(out)
    created = missing_dirs(tmp)
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # our own name: a leftover of an earlier pid
        tmp.mkdir(parents=True)
        result = write(tmp)
        fsync_dir(tmp)
        os.rename(tmp, out)  # onto an empty OUT_DIR too
    except OSError as exc:
        discard_dir(tmp, created)
        raise storage_error(out, exc) from None
    except BaseException:
        discard_dir(tmp, created)
        raise
    try:
        fsync_dir(out.parent)  # OUT_DIR is complete now: a failure here does not remove it
    except OSError as exc:
        raise storage_error(out, exc) from None
    return result
