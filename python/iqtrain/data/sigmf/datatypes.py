"""``core:datatype``: the 14 complex SigMF datatypes, read as the specification writes them
(docs/design.md "Datatypes and the metadata verdict"). The table is
:data:`iqtrain.config.sections.SIGMF_DATATYPES`."""

from __future__ import annotations

import re

from iqtrain.config.sections import SIGMF_DATATYPES, Datatype

__all__ = ["DatatypeProblem", "parse_datatype", "storage_of"]

# The specification's dataset-format rule (real or complex, a type, its byte order), anchored at
# both ends: the schema's pattern is anchored at the start only, so "cf32_lex" passes it.
_FORMAT = re.compile(r"(?P<rc>[cr])(?P<t>f64|f32|i32|i16|u32|u16|i8|u8)(?P<order>_le|_be)?")


class DatatypeProblem(ValueError):
    """A ``core:datatype`` iqtrain cannot read; the message says why."""


def parse_datatype(value: object) -> tuple[str, str | None]:
    """The canonical table name of ``value`` and a note, or DatatypeProblem.

    Canonical names are the table's: ``ci8``, ``cu8`` without a byte order (one byte has
    none: ``ci8_le`` reads as ``ci8``, with no note), every wider type with one. A wider type
    written without one (``cf32``) is read little-endian, as sigmf-python reads it on a
    little-endian host, with a note saying so. Real-valued data, and anything that is not the
    specification's format, is refused.
    """
    if not isinstance(value, str):
        raise DatatypeProblem(f"{value!r:.40} is not a datatype string (e.g. 'cf32_le')")
    m = _FORMAT.fullmatch(value)
    if m is None:
        raise DatatypeProblem(
            f"{value!r:.40} is not a SigMF datatype (complex ones: {', '.join(SIGMF_DATATYPES)})"
        )
    if m["rc"] == "r":
        raise DatatypeProblem(f"{value!r} is real-valued (real-valued data rejected)")
    kind, order = m["t"], m["order"]
    if kind in ("i8", "u8"):
        return f"c{kind}", None
    if order is None:
        return f"c{kind}_le", (
            f"{value!r} has no byte order; read as little-endian ({value}_le), as sigmf-python "
            "reads it on a little-endian host"
        )
    return value, None


def storage_of(datatypes: list[str]) -> str:
    """The dtype a batch of recordings of these datatypes holds: their family's when they all
    share one (``int8``: ci8, cu8; ``int16``: ci16, cu16), else ``float32`` (every value
    converted by value, unsigned types offset to signed)."""
    kinds: set[str] = {SIGMF_DATATYPES[d].storage for d in datatypes}
    return kinds.pop() if len(kinds) == 1 else "float32"


def datatype(name: str) -> Datatype:
    """The table's entry of a canonical name."""
    return SIGMF_DATATYPES[name]
