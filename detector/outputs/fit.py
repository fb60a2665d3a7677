"""Alerts cut to fit one record of an output, deterministically, instead of being lost.

A process's command line or environment can be 64 KiB, and control characters grow sixfold
when JSON-escaped; a syslog receiver takes 8 KiB by default and a UDP datagram at most 64 KiB.
A record that is too big is refused (EMSGSIZE), or breaks a receiver's framing and takes the
following alerts with it. So each output states its record limit and `fit` makes the alert
fit it, in steps, each tried only when the previous one was not enough:

1. the evidence `events` are left out (`hpcsec.events_omitted` says how many; the store and
   the spool keep them);
2. the longest string values are cut, all to one length, the longest length that fits (the
   values shorter than it stay whole); each cut value ends in `...[cut N->M]` (its length in
   characters before and after);
3. lists and objects (findings, tags) are written as JSON text and cut the same way;
4. only the fields that identify the alert remain, each cut to 64 characters.

A cut alert says so: `alert.truncated: true` and `alert.original_size`, the size in bytes of
the record the whole alert would have made.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

Encoder = Callable[[Mapping[str, Any]], bytes]

# What still identifies an alert when nothing else fits.
IDENTITY = (
    "@timestamp",
    "alert.id",
    "rule.id",
    "rule.title",
    "rule.level",
    "rule.vector",
    "host.name",
    "user.name",
    "slurm.job.id",
    "count",
    "alert.summary",
)
IDENTITY_CHARS = 64


def cut_text(text: str, keep: int) -> str:
    """`text` cut to `keep` characters with the marker, or whole when the cut is no shorter."""
    marked = f"{text[:keep]}...[cut {len(text)}->{keep}]"
    return marked if len(marked) < len(text) else text


def _cut_strings(alert: Mapping[str, Any], keep: int) -> dict[str, Any]:
    return {k: cut_text(v, keep) if isinstance(v, str) else v for k, v in alert.items()}


def _longest_cut_that_fits(work: dict[str, Any], encode: Encoder, room: int) -> bytes | None:
    """Binary search for the largest length every string is cut to that fits `room`."""
    longest = max((len(v) for v in work.values() if isinstance(v, str)), default=0)
    low, high = 0, longest
    best: bytes | None = None
    while low <= high:
        keep = (low + high) // 2
        body = encode(_cut_strings(work, keep))
        if len(body) <= room:
            best, low = body, keep + 1
        else:
            high = keep - 1
    return best


def _as_text(value: Any) -> Any:
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return value


def fit(alert: Mapping[str, Any], encode: Encoder, room: int) -> bytes:
    """The record `encode` makes of `alert`, or of its cut form (see the module) when the whole
    alert takes more than `room` bytes. The smallest form is returned even if it does not fit
    (`room` below what any alert needs is refused where the limit is configured)."""
    body = encode(alert)
    if len(body) <= room:
        return body
    work = {k: v for k, v in alert.items() if k != "events"}
    if "events" in alert:
        work["hpcsec.events_omitted"] = len(alert.get("events") or ())
    work["alert.truncated"] = True
    work["alert.original_size"] = len(body)
    body = encode(work)
    if len(body) <= room:
        return body
    found = _longest_cut_that_fits(work, encode, room)
    if found is not None:
        return found
    found = _longest_cut_that_fits({k: _as_text(v) for k, v in work.items()}, encode, room)
    if found is not None:
        return found
    identity = {k: work[k] for k in IDENTITY if k in work}
    identity.update({"alert.truncated": True, "alert.original_size": len(encode(alert))})
    return encode(_cut_strings(identity, IDENTITY_CHARS))
