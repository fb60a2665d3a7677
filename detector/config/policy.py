"""Who may touch what, and when: protected assets, their readers and writers, admins, and
maintenance windows. Enrichment applies this policy; rules see only its outcome."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hpcsec.detector.config.reader import ConfigReader
from hpcsec.detector.core import hostlist

ASSET_KINDS = ("model", "dataset", "checkpoint", "secret")


@dataclass(frozen=True)
class Principals:
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()

    def allows(self, user: str | None, account: str | None) -> bool:
        return (user is not None and user in self.users) or (
            account is not None and account in self.accounts
        )


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Path glob: `*` and `?` stay inside one directory, `**` crosses directories."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # `a/**/b` also matches `a/b`
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        ch = pattern[i]
        out.append("[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch))
        i += 1
    # DOTALL: a path with a newline in a name (`/models/a\nb/w.pt`) is still under `/models/**`
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@dataclass(frozen=True)
class Asset:
    name: str
    kind: str
    paths: tuple[str, ...]
    readers: Principals = Principals()
    writers: Principals = Principals()
    line: int | None = None
    # Compiled once: enrichment asks `covers` for every file access event.
    _regexes: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regexes", tuple(glob_to_regex(p) for p in self.paths))

    def covers(self, path: str) -> bool:
        return any(r.match(path) for r in self._regexes)

    def watch_roots(self) -> list[str]:
        """Directories to watch: each glob up to its first wildcard."""
        roots = []
        for p in self.paths:
            head = re.split(r"[*?\[]", p, maxsplit=1)[0]
            roots.append(head if head.endswith("/") or head == p else head.rsplit("/", 1)[0] or "/")
        return roots


@dataclass(frozen=True)
class MaintenanceWindow:
    start: datetime
    end: datetime
    hosts: tuple[str, ...] = ()  # hostlist expressions; empty = every host

    def covers(self, host: str | None, moment: datetime) -> bool:
        if not (self.start <= moment < self.end):
            return False
        return not self.hosts or (
            host is not None and any(hostlist.contains(h, host) for h in self.hosts)
        )


def parse_principals(r: ConfigReader, value: Any, *keys: str | int) -> Principals:
    m = r.mapping(value, *keys, allowed=("users", "accounts"))
    return Principals(
        r.strings(m.get("users"), *keys, "users"),
        r.strings(m.get("accounts"), *keys, "accounts"),
    )


def parse_assets(r: ConfigReader, value: Any) -> tuple[Asset, ...]:
    assets: list[Asset] = []
    for i, item in enumerate(r.items(value, "assets")):
        a = r.mapping(item, "assets", i, allowed=("name", "kind", "paths", "readers", "writers"))
        name = a.get("name")
        if not isinstance(name, str) or not name:
            raise r.fail("asset needs a name", "assets", i)
        if any(known.name == name for known in assets):
            raise r.fail(f"duplicate asset name {name!r}", "assets", i, "name")
        if a.get("kind") not in ASSET_KINDS:
            raise r.fail(
                f"asset {name!r}: kind must be one of {', '.join(ASSET_KINDS)}, "
                f"not {a.get('kind')!r}",
                "assets",
                i,
                "kind",
            )
        paths = r.strings(a.get("paths"), "assets", i, "paths")
        if not paths or not all(p.startswith("/") for p in paths):
            raise r.fail(f"asset {name!r}: paths must be absolute path globs", "assets", i, "paths")
        assets.append(
            Asset(
                name,
                a["kind"],
                paths,
                parse_principals(r, a.get("readers"), "assets", i, "readers"),
                parse_principals(r, a.get("writers"), "assets", i, "writers"),
                r.doc.line_of("assets", i),
            )
        )
    return tuple(assets)


def parse_maintenance(r: ConfigReader, value: Any) -> tuple[MaintenanceWindow, ...]:
    windows = []
    for i, item in enumerate(r.items(value, "maintenance")):
        w = r.mapping(item, "maintenance", i, allowed=("start", "end", "hosts"))
        start = r.time(w.get("start"), "maintenance", i, "start")
        end = r.time(w.get("end"), "maintenance", i, "end")
        if end <= start:
            raise r.fail("maintenance window ends before it starts", "maintenance", i)
        hosts = r.strings(w.get("hosts"), "maintenance", i, "hosts")
        for h in hosts:
            try:
                hostlist.expand(h)
            except ValueError as exc:
                raise r.fail(str(exc), "maintenance", i, "hosts") from None
        windows.append(MaintenanceWindow(start, end, hosts))
    return tuple(windows)
