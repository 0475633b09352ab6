"""Where a recording's samples are: its capture segments and the byte each starts at
(docs/design.md "Recordings, capture segments, windows").

The rules, from the SigMF specification:

- The dataset holds ``n = (bytes - core:trailing_bytes - sum of core:header_bytes) / frame``
  samples, a frame being ``core:num_channels`` interleaved complex samples. The first has the
  SigMF index ``core:offset`` (sample indices are absolute); index ``i`` is frame ``i -
  offset``.
- Each capture's ``core:header_bytes`` lie just before its first sample, so index ``i`` is at
  byte ``(i - offset) * frame`` plus the header bytes of every capture starting at or before
  it. Samples before the first capture form a leading segment of their own.
- A capture runs from its ``core:sample_start`` to the next one's. A capture that starts at or
  past the end of the samples refers to none and is ignored, with a note (the specification:
  SHOULD be ignored). One that starts before ``core:offset`` starts at ``core:offset``, with a
  note. Captures that start at the same sample leave the earlier one empty.
- Consecutive captures that differ only in ``core:sample_start`` and continue each other are one
  segment (the specification: MUST treat them as one), so windows may cross them:
  ``core:global_index``, where both have it, must advance by exactly the samples between them,
  and ``core:datetime``, where both have it, by exactly that time at ``core:sample_rate`` (to
  half a sample); a capture with header bytes never continues the one before (bytes that are not
  samples lie between them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["Layout", "LayoutProblem", "plan_layout"]

_CONTINUED = ("core:sample_start", "core:global_index", "core:datetime")


class LayoutProblem(ValueError):
    """The samples cannot be located: ``field`` names the metadata field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Layout:
    """The segments of one recording: ``segments[k] = (first SigMF index, samples)`` and
    ``bytes[k]``, the byte offset of its first frame from the start of the dataset. ``samples``:
    the dataset's samples (per channel); ``notes``: ``(field, message)`` of captures ignored
    or moved."""

    samples: int
    segments: tuple[tuple[int, int], ...]
    bytes: tuple[int, ...]
    notes: tuple[tuple[str, str], ...] = ()


# ISO 8601 as SigMF writes it: a date, a time with optional fraction, Z or an offset.
_DATETIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?(Z|z|[+-]\d{2}:?\d{2})?"
)


def _nanoseconds(value: Any) -> int | None:
    """A ``core:datetime`` as integer nanoseconds since the epoch (UTC), or None when it is not
    one the rule can compare (it is then a field that differs)."""
    if not isinstance(value, str):
        return None
    m = _DATETIME.fullmatch(value)
    if m is None:
        return None
    date, hh, mm, ss, frac, zone = m.groups()
    try:
        base = datetime.fromisoformat(f"{date}T{hh}:{mm}:{ss}").replace(tzinfo=UTC)
    except ValueError:
        return None
    seconds = int(base.timestamp())
    if zone and zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    nanos = int((frac or "0")[:9].ljust(9, "0"))
    return seconds * 1_000_000_000 + nanos


def _continues(prev: dict, cap: dict, samples: int, rate: float | None) -> bool:
    """True when capture ``cap`` continues ``prev`` (``samples`` samples later) with nothing else
    changed, so a window may run from one into the other."""
    if cap.get("core:header_bytes", 0):
        return False
    for key in prev.keys() | cap.keys():
        if key not in _CONTINUED and prev.get(key) != cap.get(key):
            return False
    a, b = prev.get("core:global_index"), cap.get("core:global_index")
    if (a is None) != (b is None):
        return False
    if a is not None and not (type(a) is int and type(b) is int and b - a == samples):
        return False
    t0, t1 = prev.get("core:datetime"), cap.get("core:datetime")
    if (t0 is None) != (t1 is None):
        return False
    if t0 is not None and t0 != t1:
        n0, n1 = _nanoseconds(t0), _nanoseconds(t1)
        if n0 is None or n1 is None or not rate:
            return False
        # Exactly `samples` sample periods apart, to half a period.
        if abs((n1 - n0) - samples * 1e9 / rate) > 0.5e9 / rate:
            return False
    elif t0 is not None and samples:
        return False  # the same time for later samples: not a continuation
    return True


def plan_layout(
    *,
    region: int,
    frame: int,
    offset: int,
    trailing: int,
    captures: list[dict],
    rate: float | None,
) -> Layout:
    """The segments of a dataset of ``region`` bytes with frames of ``frame`` bytes.

    ``captures`` are the metadata's, each checked already (a dict with an integer
    ``core:sample_start`` >= 0, in non-decreasing order, and ``core:header_bytes``, when
    present, an integer >= 0). LayoutProblem when the header and trailing bytes leave no
    room or the rest is not a whole number of frames."""
    headers = sum(c.get("core:header_bytes", 0) for c in captures)
    payload = region - trailing - headers
    if payload < 0:
        raise LayoutProblem(
            "core:header_bytes" if headers else "core:trailing_bytes",
            f"{headers} header and {trailing} trailing bytes are more than the data's {region}",
        )
    if payload % frame:
        less = f" (of {region}, less {headers} header and {trailing} trailing)"
        raise LayoutProblem(
            "data length", f"{payload} bytes" + (less if headers or trailing else "")
        )
    n = payload // frame
    end = offset + n
    caps = captures or [{"core:sample_start": offset}]
    notes: list[tuple[str, str]] = []
    segments: list[list[int]] = []  # [first index, samples, byte], merged as they continue
    before = 0  # header bytes of the captures so far
    prev: dict | None = None
    first = caps[0]["core:sample_start"]
    if first > offset:  # samples before the first capture: a leading segment of their own
        segments.append([offset, min(first, end) - offset, 0])
    for i, cap in enumerate(caps):
        start = cap["core:sample_start"]
        before += cap.get("core:header_bytes", 0)
        if start >= end:
            notes.append(
                (
                    f"captures[{i}].core:sample_start",
                    f"{start} is at or past the end of the samples ({end}); the capture is ignored",
                )
            )
            continue
        if start < offset:
            notes.append(
                (
                    f"captures[{i}].core:sample_start",
                    f"{start} is before the first sample (core:offset {offset}); the capture "
                    f"starts at {offset}",
                )
            )
            start = offset
        nxt = caps[i + 1]["core:sample_start"] if i + 1 < len(caps) else end
        count = max(min(nxt, end), start) - start
        last = segments[-1] if segments else None
        if (
            prev is not None
            and last is not None
            and last[0] + last[1] == start
            and _continues(prev, cap, start - prev["core:sample_start"], rate)
        ):
            last[1] += count
        else:
            segments.append([start, count, (start - offset) * frame + before])
        prev = cap
    return Layout(
        samples=n,
        segments=tuple((a, c) for a, c, _ in segments),
        bytes=tuple(b for _, _, b in segments),
        notes=tuple(notes),
    )
