"""Reading SigMF as people and tools write it (docs/design.md "Recordings and
windows", docs/data.md):
loose ``.sigmf-meta`` files, ``.sigmf`` archives read in place, ``.sigmf-collection`` files,
non-conforming datasets (a raw capture beside its metadata, header and trailing bytes), every
complex datatype, one channel of interleaved ones.

- :mod:`.inputs`: what a data list names, expanded into recordings to read;
- :mod:`.archive`: an archive's members, listed without extracting;
- :mod:`.metadata`: one recording's verdict (what iqtrain uses must be well formed, the rest
  is noted) and where its samples are;
- :mod:`.layout`: capture segments and their bytes;
- :mod:`.datatypes`: ``core:datatype``;
- :mod:`.schema`: the SigMF schema, checked fast;
- :mod:`.annotations`: annotations and label keys.

Imports no torch.
"""

from iqtrain.data.sigmf.annotations import MISSING, Annotation, field_at, read_annotations
from iqtrain.data.sigmf.inputs import Expanded, Source, expand
from iqtrain.data.sigmf.metadata import Recording, meta_sha256, read_recording
from iqtrain.data.sigmf.schema import validate_metadata

__all__ = [
    "MISSING",
    "Annotation",
    "Expanded",
    "Recording",
    "Source",
    "expand",
    "field_at",
    "meta_sha256",
    "read_annotations",
    "read_recording",
    "validate_metadata",
]
