"""Files on disk: durable writes of evidence, and the one way an untrusted pickle is read.

Every write of an attempt's evidence goes through here, so a failure (disk full, file too large,
I/O error) is always a :class:`~iqtrain.errors.StorageError` naming the file, and a replaced
file is either its old content or its new content, never a mix.

A pickle nobody vouches for (a downloaded dataset, a checkpoint's DCP metadata) is read by a
:class:`RestrictedUnpickler`: every global it names is admitted or refused before anything is
imported or called. Imports no torch.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from iqtrain.errors import ConfigError, StorageError

__all__ = [
    "RestrictedUnpickler",
    "check_output_file",
    "check_output_parent",
    "creatable_dir",
    "discard_dir",
    "file_digest",
    "fsync_dir",
    "fsync_file",
    "missing_dirs",
    "remove_dirs",
    "storage_error",
    "unlink_quietly",
    "write_bytes_atomic",
    "write_file",
    "write_json_atomic",
]


def storage_error(path: Path, exc: BaseException) -> StorageError:
    """One line naming the file: ``<path>: cannot write: <reason>``."""
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        reason = " ".join(str(exc).split()) or type(exc).__name__
    return StorageError(f"{path}: cannot write: {reason}")


def file_digest(path: Path) -> dict[str, Any]:
    """``{"bytes": n, "sha256": hex}`` of a file."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a fsynced temporary file and a rename.

    Raises ``StorageError`` naming ``path`` if any write, fsync or rename fails; the temporary
    file is removed and ``path`` keeps its previous content (or stays absent). ``ValueError`` /
    ``TypeError`` (``obj`` not JSON-able, non-finite floats) are raised before anything is
    written.
    """
    data = (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    write_bytes_atomic(path, data)


def write_file(path: Path, data: bytes) -> None:
    """Create ``path`` (replacing a stale one) holding ``data``, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def creatable_dir(path: Path) -> str | None:
    """Why directory ``path`` cannot be created and written (None: it can), found by creating
    and removing a directory in its nearest existing ancestor: a permission check alone says
    yes to root, and to a read-only or virtual file system. Each name still to be made must fit
    that file system (``NAME_MAX``), and no ancestor may be a symbolic link to nothing (dangling,
    or a loop): ``mkdir`` fails there, after whatever work came first."""
    probe, missing = Path(path), []
    while True:
        try:
            os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(probe):
                return f"{probe}: a symbolic link to nothing"
        except OSError as exc:  # a symlink loop, a path too long, no permission
            return f"{probe}: {exc.strerror or exc}"
        if probe == probe.parent:  # "." of a removed working directory
            return f"{probe}: {os.strerror(errno.ENOENT)}"
        missing.append(probe.name)
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    try:
        name_max = os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for name in reversed(missing):
        if len(os.fsencode(name)) > name_max:
            return f"{name}: {os.strerror(errno.ENAMETOOLONG)} (at most {name_max} bytes here)"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".iqtrain-probe-", dir=probe))
    except OSError as exc:
        return f"{probe}: {exc.strerror or exc}"
    return None


def missing_dirs(path: Path) -> list[Path]:
    """The ancestors of ``path`` that do not exist yet, deepest first: what
    ``path.mkdir(parents=True)`` makes besides ``path``, for :func:`remove_dirs` to take back."""
    missing = []
    for parent in Path(path).parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def discard_dir(tmp: Path, created: list[Path]) -> None:
    """After a failure: remove the temporary directory ``tmp`` (whatever it holds), then the
    parents made for it (``created``, from :func:`missing_dirs`) that are empty now."""
    shutil.rmtree(tmp, ignore_errors=True)
    remove_dirs(created)


def remove_dirs(dirs: list[Path]) -> None:
    """Remove the directories ``dirs`` (deepest first, as :func:`missing_dirs` lists them) while
    they are empty: the first that is not, or cannot go, ends it."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a fsynced temporary file and a rename (StorageError)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_file(tmp, data)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        unlink_quietly(tmp)
        raise storage_error(path, exc) from exc
    except BaseException:
        unlink_quietly(tmp)
        raise


# --------------------------------------------------------------------------------------------
# Reading a pickle nobody vouches for


class _Opcodes(dict[int, Callable[[Any], None]]):
    """An unpickler's dispatch table: an opcode it does not have is a damaged pickle (the
    pure-Python unpickler would raise a bare KeyError)."""

    def __missing__(self, code: int) -> Callable[[Any], None]:
        raise pickle.UnpicklingError(f"invalid load key, {bytes([code])!r}")


class RestrictedUnpickler(pickle._Unpickler):
    """Python's own unpickler (``pickle._Unpickler``, the reference the C one implements) for
    bytes nobody vouches for: each global the pickle names goes to :meth:`admit`, and one it
    does not admit is refused (:meth:`refused`) before anything is imported or called.

    A subclass says what it admits: ``admit(module, name)`` returns what the pickle gets for
    that global (a stand-in, or the real object through :meth:`import_global`), or None to
    refuse it. :meth:`with_opcodes` gives a subclass a dispatch table in which some opcodes
    are read its own way (the unpickler's ``stack``, ``append`` and ``pop_mark`` are theirs).
    """

    stack: list[Any]  # pickle._Unpickler's, not in its type stub
    pop_mark: Callable[[], list[Any]]
    append: Callable[[Any], None]

    dispatch = _Opcodes(pickle._Unpickler.dispatch)

    @classmethod
    def with_opcodes(cls, changes: Mapping[int, Callable[[Any], None]]) -> _Opcodes:
        """This class's dispatch table with ``changes`` (opcode -> method) made."""
        table = _Opcodes(cls.dispatch)
        table.update(changes)
        return table

    def admit(self, module: str, name: str) -> Any | None:
        """What the pickle gets for global ``module.name``; None refuses it (all, here)."""
        return None

    def refused(self, module: str, name: str) -> Exception:
        """The error a global that :meth:`admit` refused is (raised; nothing of it ran)."""
        return pickle.UnpicklingError(f"refused pickle global {module}.{name}")

    def import_global(self, module: str, name: str) -> Any:
        """The real ``module.name`` (imported), for an :meth:`admit` that allows it."""
        return super().find_class(module, name)

    def find_class(self, module: str, name: str, /) -> Any:
        found = self.admit(module, name)
        if found is None:
            raise self.refused(module, name)
        return found


def check_output_file(path: Path, force: bool, flag: str, command: str) -> None:
    """Refuse an output file before any work (ConfigError naming ``flag``): a directory; anything
    there but a regular file (a device, a FIFO, a symbolic link: ``--force`` replaces a file,
    never those); an existing file without ``force``; a path inside an attempt directory (its
    files are evidence); a parent that is not a writable directory; a name too long for the
    temporary sibling."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"{flag}: {path}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{flag}: {path} is a directory; name a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise ConfigError(
            f"{flag}: {path} is {what}; {command} writes (and --force replaces) files"
        )
    if st is not None and not force:
        raise ConfigError(f"{flag}: {path} exists; pass --force to replace it")
    check_output_parent(path, flag)


def check_output_parent(path: Path, flag: str) -> None:
    """Where an output ``path`` goes (ConfigError naming ``flag``): a parent that is a writable
    directory, outside every attempt directory (its files are evidence), and a name that fits
    the temporary sibling it is written through."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{flag}: {parent} is not a directory")
    for above in (parent.resolve(), *parent.resolve().parents):
        if (above / "attempt.json").is_file():
            raise ConfigError(f"{flag}: {path} is inside attempt {above}; its files are evidence")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: {parent} is not writable")
    if len(f".{path.name}.tmp-{os.getpid()}".encode()) > 255:
        raise ConfigError(f"{flag}: {path.name!r} is too long a file name")
