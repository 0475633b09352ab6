"""The SigMF schema check: the same verdict and message as the sigmf package's own, faster; and
every violation listed, with its field, for the reader to sort into refusals and notes."""

from __future__ import annotations

import copy
import warnings

import pytest

from iqtrain.data.sigmf.schema import (
    _compile,
    _compiled_check,
    _schema_validator,
    _Unsupported,
    schema_problems,
    validate_metadata,
)

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
    assert _verdict(validate_metadata, md) == want
    assert (want is None) == (case == "valid")


# --- the compiled check: jsonschema's verdict, without walking the schema generically ---------

# Values that sit on each keyword's edges: bools (not integers to JSON Schema), integral floats
# (integers), NaN and infinities, the int64 bounds, strings either side of each pattern.
_VALUES = [
    None, True, False, 0, 1, -1, 1.0, 1.5, -0.0, float("nan"), float("inf"), -float("inf"),
    2**63 - 1, 2**63, 10**12, 10**12 + 1, 1e12, "", "x", "ci16_le", "rf32", "1.2.0", "1.2",
    "a" * 128, "0" * 128, "g" * 128, [], [1], [1, 2], [1.0, 2, 3], [1, 2, 3, 4], {},
    [{"name": "a", "version": "1", "optional": True}], [{"name": "a", "version": "1"}],
    [{"name": "a", "version": "1", "optional": 1}],
    [{"name": "a", "version": "1", "optional": True, "x": 1}],
    {"type": "Point", "coordinates": [1, 2]}, {"type": "Pointy", "coordinates": [1, 2]},
    {"type": "Point", "coordinates": [1]}, {"type": "Point", "coordinates": [1, 2], "bbox": [1]},
    [{"core:sample_start": 0}], [{"core:sample_start": -1}], [{}], [5], "2020-01-01T00:00:00Z",
]  # fmt: skip
_KEYS = {
    "global": [
        "core:datatype", "core:sample_rate", "core:version", "core:sha512", "core:num_channels",
        "core:offset", "core:extensions", "core:geolocation", "core:license",
        "core:metadata_only", "core:dataset", "core:trailing_bytes", "core:author", "x:y",
    ],
    "captures": [
        "core:sample_start", "core:datetime", "core:frequency", "core:global_index",
        "core:header_bytes", "core:geolocation", "x:y",
    ],
    "annotations": [
        "core:sample_start", "core:sample_count", "core:label", "core:uuid",
        "core:freq_lower_edge", "core:comment",
    ],
}  # fmt: skip


def _mutant(rng) -> dict:
    """VALID with one to three random edits: a section replaced or dropped, an unknown top-level
    key, or a field of a section (or of one of its items) set to an edge value or removed."""
    md = copy.deepcopy(VALID)
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.05:
            md[rng.choice(list(_KEYS))] = copy.deepcopy(rng.choice(_VALUES))
        elif r < 0.08:
            md.pop(rng.choice(list(_KEYS)), None)
        elif r < 0.1:
            md["extra"] = 1
        else:
            section = rng.choice(list(_KEYS))
            node = md.get(section)
            if isinstance(node, list):
                if not node or rng.random() < 0.1:
                    node.append({"core:sample_start": 3})
                node = rng.choice(node)
            if isinstance(node, dict):
                key = rng.choice(_KEYS[section])
                if rng.random() < 0.15:
                    node.pop(key, None)
                else:
                    node[key] = copy.deepcopy(rng.choice(_VALUES))
    return md


def test_the_compiled_check_agrees_with_jsonschema_on_every_mutant():
    import random

    fast = _compiled_check()
    assert fast is not None  # this sigmf's schema uses only compiled keywords
    validator = _schema_validator()
    rng = random.Random(0)
    verdicts = set()
    for _ in range(3000):
        md = _mutant(rng)
        want = validator.is_valid(md)
        assert fast(md) == want, md
        verdicts.add(want)
    assert verdicts == {True, False}


def test_a_keyword_that_is_not_compiled_leaves_every_file_to_jsonschema():
    with pytest.raises(_Unsupported, match=r"\$ref"):
        _compile({"properties": {"a": {"$ref": "#/x"}}})
    with pytest.raises(_Unsupported, match="prefixItems"):
        _compile({"prefixItems": [{"type": "string"}]})
    # Keywords draft 2020-12 does not act on are ignored, as jsonschema ignores them.
    check = _compile({"additionalItems": False, "title": "t", "items": {"type": "integer"}})
    assert check([1, 2.0]) and not check([1, True]) and check("not an array")


def test_a_file_the_compiled_check_fails_gets_jsonschemas_message(monkeypatch):
    import iqtrain.data.sigmf.schema as schema

    # Whatever the compiled check says, the verdict and message are jsonschema's.
    monkeypatch.setattr(schema, "_compiled_check", lambda: lambda md: False)
    assert _verdict(validate_metadata, VALID) is None
    for case, md in CASES.items():
        assert _verdict(validate_metadata, md) == _verdict(_sigmfs_own, md), case


def test_every_violation_is_listed_with_its_field():
    md = _edit(("global", "core:version"), "1.0")
    md["captures"][0]["core:datetime"] = 12345
    del md["annotations"]
    found = dict(schema_problems(md))
    assert set(found) == {("global", "core:version"), ("captures", 0, "core:datetime"), ()}
    assert "'annotations' is a required property" in found[()]
    assert schema_problems(VALID) == []


def test_the_listing_stops_at_its_cap():
    from iqtrain.data.sigmf.schema import MAX_PROBLEMS

    md = copy.deepcopy(VALID)
    md["annotations"] = [{"core:sample_start": 0, "core:label": 7}] * (2 * MAX_PROBLEMS)
    assert len(schema_problems(md)) == MAX_PROBLEMS
