"""The SigMF metadata check: the same verdict and message as the sigmf package's own, faster."""

from __future__ import annotations

import copy
import warnings

import pytest

from iqtrain.data.sigmf_meta import _validate

VALID = {
    "global": {
        "core:datatype": "ci16_le",
        "core:sample_rate": 1e6,
        "core:version": "1.2.0",
        "core:extensions": [{"name": "iqtrain", "version": "1.0.0", "optional": True}],
    },
    "captures": [{"core:sample_start": 0, "core:frequency": 915e6}],
    "annotations": [{"core:sample_start": 0, "core:sample_count": 10, "core:label": "x"}],
}


def _edit(path: tuple, value) -> dict:
    md = copy.deepcopy(VALID)
    node = md
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return md


_DELETE = object()
CASES = {
    "valid": VALID,
    "datatype a number": _edit(("global", "core:datatype"), 3),
    "sample rate a string": _edit(("global", "core:sample_rate"), "fast"),
    "version not a version": _edit(("global", "core:version"), 12),
    "no captures": _edit(("captures",), _DELETE),
    "no annotations": _edit(("annotations",), _DELETE),
    "captures not a list": _edit(("captures",), {"core:sample_start": 0}),
    "negative start": _edit(("captures", 0, "core:sample_start"), -4),
    "start a float": _edit(("annotations", 0, "core:sample_start"), 1.5),
    "label a number": _edit(("annotations", 0, "core:label"), 7),
    "extensions malformed": _edit(("global", "core:extensions"), [{"name": 3}]),
    "unordered annotations": _edit(
        ("annotations",), [{"core:sample_start": 9}, {"core:sample_start": 2}]
    ),
    "unordered captures": _edit(
        ("captures",), [{"core:sample_start": 9}, {"core:sample_start": 2}]
    ),
    "annotation without start": _edit(("annotations",), [{"core:sample_count": 2}]),
}
# (A metadata without a "global" object never gets here: the reader refuses it first, naming
# the field; sigmf's own path failed on it with a bare KeyError.)


def _sigmfs_own(md: dict) -> None:
    from sigmf import validate
    from sigmf.sigmffile import SigMFFile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validate.validate(md, SigMFFile(metadata=md).get_schema())


def _verdict(check, md: dict) -> tuple[str, str, tuple] | None:
    """What ``check(md)`` says: None, or the error's class, message and JSON path."""
    try:
        check(copy.deepcopy(md))
    except Exception as exc:
        return (
            type(exc).__name__,
            getattr(exc, "message", None) or str(exc),
            tuple(getattr(exc, "absolute_path", ())),
        )
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_verdict_and_the_message_are_sigmfs(case):
    md = CASES[case]
    want = _verdict(_sigmfs_own, md)
    assert _verdict(_validate, md) == want
    assert (want is None) == (case == "valid")
