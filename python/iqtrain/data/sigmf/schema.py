"""The SigMF metadata schema, checked as sigmf-python's validator checks it, at a fraction of
its cost (docs/design.md "Recordings, capture segments, windows", start-up).

:func:`validate_metadata` is ``sigmf.validate.validate``'s verdict; :func:`schema_problems`
lists every violation (field path and message) for the reader to sort into the fields iqtrain
uses (a refusal) and the ones it does not (a note). A predicate compiled once from the schema
passes a valid file without jsonschema; a file it fails goes through jsonschema, whose verdict
and messages stand.
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Callable
from typing import Any

__all__ = ["schema_problems", "validate_metadata"]


@functools.cache
def _schema_validator() -> Any:
    """The SigMF metadata schema's validator, built (and the schema itself checked) once per
    process. ``sigmf.validate.validate`` builds both again for every file, through
    ``jsonschema.validate``: that is 95% of opening a small recording."""
    import jsonschema
    from sigmf import schema

    ref = schema.get_schema()  # sigmf has one schema file, whatever core:version says
    cls = jsonschema.validators.validator_for(ref)
    cls.check_schema(ref)
    return cls(ref)


Check = Callable[[Any], bool]


class _Unsupported(Exception):
    """A schema keyword the compiled check does not implement: jsonschema checks every file."""


def _is_number(x: Any) -> bool:
    t = type(x)
    if t is float or t is int:  # what json.loads makes: skip the ABC check
        return True
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _is_integer(x: Any) -> bool:
    # jsonschema's draft 6+ type checker: an int that is not a bool, or an integral float.
    t = type(x)
    if t is int:
        return True
    return (isinstance(x, int) and not isinstance(x, bool)) or (
        isinstance(x, float) and x.is_integer()
    )


# The draft 2020-12 type checker's seven types, as jsonschema defines them.
_TYPES: dict[str, Check] = {
    "array": lambda x: isinstance(x, list),
    "boolean": lambda x: isinstance(x, bool),
    "integer": _is_integer,
    "null": lambda x: x is None,
    "number": _is_number,
    "object": lambda x: isinstance(x, dict),
    "string": lambda x: isinstance(x, str),
}


def _all(checks: list[Check]) -> Check:
    """One predicate, true when every check is (plain loops: this runs per value per file)."""
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]

    def check(x: Any) -> bool:
        for c in checks:  # noqa: SIM110 - all() over a generator took twice as long here
            if not c(x):
                return False
        return True

    return check


def _type_check(types: Any) -> Check:
    names = [types] if isinstance(types, str) else list(types)
    if any(n not in _TYPES for n in names):
        raise _Unsupported("type")
    checks = [_TYPES[n] for n in names]
    return checks[0] if len(checks) == 1 else lambda x: any(c(x) for c in checks)


def _object_check(schema: dict) -> Check | None:
    """``properties``, ``required`` and ``additionalProperties`` in one pass over the value's
    keys; each asserts nothing about a non-object (as in jsonschema)."""
    props = {k: _compile(v) for k, v in schema.get("properties", {}).items()}
    required = tuple(schema.get("required", ()))
    extra = schema.get("additionalProperties", True)
    rest = None if extra is True else _compile(extra)
    if not props and not required and rest is None:
        return None

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for k in required:
            if k not in x:
                return False
        for k, v in x.items():
            c = props.get(k, rest)
            if c is not None and not c(v):
                return False
        return True

    return check


def _bound_checks(s: dict) -> list[Check]:
    """minimum, maximum, exclusive bounds (numbers only) and minItems, maxItems (arrays only)."""
    out: list[Check] = []
    if "minimum" in s:
        lo = s["minimum"]
        out.append(lambda x: not _is_number(x) or not x < lo)
    if "maximum" in s:
        hi = s["maximum"]
        out.append(lambda x: not _is_number(x) or not x > hi)
    if "exclusiveMinimum" in s:
        elo = s["exclusiveMinimum"]
        out.append(lambda x: not _is_number(x) or not x <= elo)
    if "exclusiveMaximum" in s:
        ehi = s["exclusiveMaximum"]
        out.append(lambda x: not _is_number(x) or not x >= ehi)
    if "minItems" in s:
        least = s["minItems"]
        out.append(lambda x: not isinstance(x, list) or not len(x) < least)
    if "maxItems" in s:
        most = s["maxItems"]
        out.append(lambda x: not isinstance(x, list) or not len(x) > most)
    return out


def _value_checks(s: dict) -> list[Check]:
    """The keywords on one value: each as jsonschema's keyword function decides it."""
    out: list[Check] = []
    if "type" in s:
        out.append(_type_check(s["type"]))
    if "enum" in s:
        # jsonschema compares a string with ==, so an enum of strings is a set of strings; other
        # members have its own JSON equality (1 != True): not compiled.
        if not all(isinstance(e, str) for e in s["enum"]):
            raise _Unsupported("enum")
        enum = frozenset(s["enum"])
        out.append(lambda x: isinstance(x, str) and x in enum)
    if "pattern" in s:
        search = re.compile(s["pattern"]).search  # re.search(pattern, x), compiled once
        out.append(lambda x: not isinstance(x, str) or search(x) is not None)
    out += _bound_checks(s)
    if "items" in s:
        item = _compile(s["items"])
        out.append(lambda x: not isinstance(x, list) or all(item(v) for v in x))
    return out


# Keywords the compiled check implements; "format" asserts nothing without a format checker
# (iqtrain's validator has none, as jsonschema.validate's had none).
_COMPILED = frozenset(
    {
        "type", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "minItems", "maxItems", "items", "properties", "required", "additionalProperties",
        "format",
    }
)  # fmt: skip


def _compile(schema: Any) -> Check:
    """``schema`` as one predicate: True exactly when jsonschema finds no error in a value.

    Raises _Unsupported for any keyword jsonschema's draft 2020-12 validator acts on that is not
    in _COMPILED ($ref, prefixItems, ...); keywords it ignores (additionalItems, titles) are
    ignored here too."""
    import jsonschema

    if schema is True:
        return lambda x: True
    if schema is False:
        return lambda x: False
    acted_on = set(schema) & set(jsonschema.Draft202012Validator.VALIDATORS)
    if acted_on - _COMPILED:
        raise _Unsupported(", ".join(sorted(acted_on - _COMPILED)))
    obj = _object_check(schema)
    return _all(_value_checks(schema) + ([obj] if obj is not None else []))


@functools.cache
def _compiled_check() -> Check | None:
    """The SigMF schema compiled into one predicate, or None when it uses a keyword that is not
    compiled (a later sigmf): then jsonschema itself decides every file.

    jsonschema walks the schema generically (a validator object evolved per keyword and value):
    966 us a small recording on a 2-core CPU, against 54 us for this closure tree (18x,
    bench/test_startup.py). A file it fails is handed to jsonschema for the
    verdict and the message, so the error is unchanged.
    """
    import jsonschema

    validator = _schema_validator()
    if type(validator) is not jsonschema.Draft202012Validator or validator.format_checker:
        return None
    try:
        return _compile(validator.schema)
    except _Unsupported:
        return None


def validate_metadata(metadata: dict) -> None:
    """Exactly ``sigmf.validate.validate(metadata, schema)``, with the validator built once:
    ``jsonschema.validate``'s best-match error, then sigmf's sample-start ordering rule (its
    warning about undeclared extensions is not an error, and was silenced before too). The
    compiled check (:func:`_compiled_check`) passes a valid file without jsonschema; a file it
    fails goes through jsonschema, whose verdict and message stand."""
    import jsonschema

    fast = _compiled_check()
    if fast is None or not fast(metadata):
        error = jsonschema.exceptions.best_match(_schema_validator().iter_errors(metadata))
        if error is not None:
            raise error
    for key in ("captures", "annotations"):
        count = -1
        for item in metadata[key]:
            new_count = item["core:sample_start"]
            if new_count < count:
                raise jsonschema.exceptions.ValidationError(
                    f"{key} has incorrect sample start ordering."
                )
            count = new_count


#: At most this many violations of one file are listed (a file of 10^5 broken annotations
#: would otherwise cost seconds to describe); the reader needs their fields, not every one.
MAX_PROBLEMS = 1000


def schema_problems(metadata: Any) -> list[tuple[tuple[Any, ...], str]]:
    """Every SigMF schema violation of ``metadata`` as ``(field path, message)``, in the order
    jsonschema finds them (at most :data:`MAX_PROBLEMS`); empty for a valid file. The path is
    the violating value's (``("global", "core:version")``, ``("captures", 2,
    "core:datetime")``; ``()`` for the top-level object, e.g. a missing ``annotations``).
    The compiled check decides a valid file without jsonschema."""
    fast = _compiled_check()
    if fast is not None and fast(metadata):
        return []
    out = []
    for error in _schema_validator().iter_errors(metadata):
        out.append((tuple(error.absolute_path), error.message))
        if len(out) >= MAX_PROBLEMS:
            break
    return out
