"""A recording's annotations, and the label an annotation carries (docs/data.md, labels).

Annotations are read only by what needs labels (the probe, fine-tuning, embed, score, predict);
training ignores them, so a malformed annotation never stops pretraining. Read, each is checked
against its data: an integer ``core:sample_start`` inside the samples, an integer
``core:sample_count`` (missing: to the end of the data), a DataError naming ``annotations[i]``
otherwise.

A label key is a field name (``core:label``) or a path into an annotation's objects
(``signal:detail.mod_class`` reads ``annotation["signal:detail"]["mod_class"]``): the whole key
is tried as a field first, then its dot-separated parts. A path that does not resolve leaves
the annotation unlabelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from iqtrain.data.sigmf.metadata import INT_MAX, Recording, read_metadata
from iqtrain.errors import DataError

__all__ = ["MISSING", "Annotation", "field_at", "read_annotations"]

#: What :func:`field_at` gives for a key that does not resolve.
MISSING: Any = object()


@dataclass(frozen=True)
class Annotation:
    """One SigMF annotation: samples ``[sample_start, sample_start + sample_count)`` (SigMF
    indices, as written)."""

    sample_start: int
    sample_count: int
    label: str | None  # core:label; None when the annotation has none
    # Every field of the annotation as written (``iqtrain:snr_db``, ``signal:detail``, ...):
    # what ``iqtrain probe --by`` bins by and a label key reads.
    fields: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def field_at(fields: dict[str, Any], key: str) -> Any:
    """The value of ``key`` in an annotation's fields: the field of that exact name, else the
    path of its dot-separated parts through nested objects; :data:`MISSING` when neither
    resolves."""
    if key in fields:
        return fields[key]
    if "." not in key:
        return MISSING
    node: Any = fields
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def _index(rec: Recording, field: str, value: Any) -> int:
    """An annotation's integer field (JSON Schema's integers: ``5.0`` is 5), >= 0."""
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or not 0 <= value <= INT_MAX:
        raise DataError(
            f"{rec.meta_path}: {field}: must be an integer in [0, 2^63), got {value!r:.40}"
        )
    return value


def _count(rec: Recording, where: str, ann: dict, start: int) -> int:
    end = rec.offset + rec.num_samples
    count = _index(
        rec, f"{where}.core:sample_count", ann.get("core:sample_count", max(end - start, 0))
    )
    if start < rec.offset or start + count > end:
        raise DataError(
            f"{rec.meta_path}: {where}: samples [{start}, {start + count}) are not all in the "
            f"data (samples [{rec.offset}, {end}) of {rec.data_name})"
        )
    return count


def read_annotations(rec: Recording) -> list[Annotation]:
    """The annotations of ``rec``, in metadata order, each checked against its data.

    A missing ``core:sample_count`` runs to the end of the data (the SigMF reading). Samples an
    annotation claims outside the data would be misread, so that is a DataError naming
    ``annotations[i]``, as is a non-integer start or count. A missing ``annotations`` list is
    none. ``label`` is the ``core:label`` when it is a string."""
    metadata = read_metadata(rec)
    annotations = metadata.get("annotations", [])
    if not isinstance(annotations, list):
        raise DataError(f"{rec.meta_path}: annotations: must be an array of annotation objects")
    found = []
    for i, ann in enumerate(annotations):
        where = f"annotations[{i}]"
        if not isinstance(ann, dict):
            raise DataError(f"{rec.meta_path}: {where}: must be an object")
        start = _index(rec, f"{where}.core:sample_start", ann.get("core:sample_start"))
        count = _count(rec, where, ann, start)
        label = ann.get("core:label")
        found.append(Annotation(start, count, label if isinstance(label, str) else None, ann))
    return found
