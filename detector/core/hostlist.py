"""Slurm hostlist expressions: `gpu[001-004,010],login1` <-> a list of host names."""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_HOSTS = 100_000  # above the largest clusters; bounds what a bad record costs


def _split_top_level(expr: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in hostlist {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(body: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in hostlist")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in hostlist")
        if int(hi) - int(lo) > MAX_HOSTS:
            raise ValueError(f"range {item!r} is too large")
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_one(host: str) -> list[str]:
    # `rack[1-2]-n[01-02]`: the cartesian product of every bracket, sized before it is built
    # so that a few short brackets cannot ask for billions of names.
    pieces = re.split(r"\[([^\[\]]*)\]", host)
    literals, ranges = pieces[0::2], [_expand_ranges(body) for body in pieces[1::2]]
    total = 1
    for numbers in ranges:
        total *= len(numbers)
        if total > MAX_HOSTS:
            raise ValueError(f"hostlist {host!r} expands to too many hosts")
    out = []
    for combo in itertools.product(*ranges):
        name = literals[0]
        for number, literal in zip(combo, literals[1:], strict=True):
            name += number + literal
        out.append(name)
    return out


def expand(expr: str | list[str] | None) -> list[str]:
    """Expand a hostlist (`gpu[001-003,010]`, `a,b`, `rack[1-2]-n[01-02]`) in order."""
    if not expr:
        return []
    if isinstance(expr, list):
        return [h for item in expr for h in expand(item)]
    if expr.strip() in ("(null)", "None"):
        return []
    hosts: list[str] = []
    for part in _split_top_level(expr):
        hosts.extend(_expand_one(part))
        if len(hosts) > MAX_HOSTS:
            raise ValueError("hostlist expands to too many hosts")
    return hosts


def contains(expr: str | list[str], host: str) -> bool:
    return host in expand(expr)
