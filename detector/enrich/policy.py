"""Site policy at enrichment: what the site config says about each event (a contract).

Rules stay generic Sigma because the site-specific decisions are made here, once per event,
and written into fields the rules test:

- `file_access` under a protected asset: `hpcsec.asset.name`, `.kind`, `.read_allowed`,
  `.write_allowed` (allowed by user name, or by the Slurm account of the accessing job);
- events with a user: `user.is_admin`; with a uid: `user.is_system` (uid below 1000);
- events with a process: `process.executable_name` (the executable's file name, which the
  kernel does not cut at 15 characters as it cuts `process.name`), `process.is_gpu_service`
  (the site's `gpu_services`, by executable and owner: see `Policy.is_gpu_service`);
- events with `process.env.LD_PRELOAD`: `process.ld_preload_allowed`, whether every library
  it preloads is one the site allows (`ld_preload_allowed`: see `preload_allowed`);
- every event: `hpcsec.in_maintenance` (a maintenance window covers the host and the time);
- `firmware` events: `firmware.baseline_version`, `firmware.drift`,
  `firmware.known_vulnerable`. The firmware sensor reports versions only; this is the one
  place these are decided. An event that already holds them (read back from an events file
  enriched before) keeps them.

This runs on every event, so the per-config work (asset globs, windows) is prepared once and
asset lookups are memoised by path.

`annotate_fleet_majority` is the one policy that needs many hosts at once: it is applied to a
whole scan's firmware events (collected from several nodes) before the rules run.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from hpcsec.detector.config.site import Asset, SiteConfig
from hpcsec.detector.core.schema import Event, parse_time
from hpcsec.sensors import proclists

SYSTEM_UID_LIMIT = 1000  # regular users are uid >= 1000 (Debian/Red Hat convention)
COMM_MAX = 15  # the kernel keeps the first 15 bytes of an executable's name as `comm`
_SYSTEM_LIB_DIR = re.compile(r"^/(usr/(local/)?)?lib(32|64)?(/[a-z0-9_]+-linux-gnu[a-z0-9_]*)?$")
MIN_FLEET_HOSTS = 3  # a majority of two hosts says nothing
_PATH_CACHE_SIZE = 65536
_NO_ASSET = object()
POLICY_FIELDS = frozenset(
    {
        "hpcsec.in_maintenance",
        "user.is_admin",
        "user.is_system",
        "process.is_gpu_service",
        "process.executable_name",
        "process.ld_preload_allowed",
        "hpcsec.asset.name",
        "hpcsec.asset.kind",
        "hpcsec.asset.read_allowed",
        "hpcsec.asset.write_allowed",
        "firmware.baseline_version",
        "firmware.drift",
        "firmware.known_vulnerable",
    }
)


class Policy:
    """The site config prepared for per-event decisions."""

    def __init__(self, config: SiteConfig):
        self.config = config
        self.admins = frozenset(config.admins.users)
        self.gpu_service_paths = frozenset(s for s in config.gpu_services if s.startswith("/"))
        self.gpu_service_names = frozenset(s for s in config.gpu_services if "/" not in s)
        self.preload_allowed = config.list_values("ld_preload_allowed")
        self.windows = config.maintenance
        self._assets: dict[str, Asset | object] = {}
        self._last_time: tuple[str, datetime | None] = ("", None)  # a sample shares its time

    def asset_for(self, path: str) -> Asset | None:
        found = self._assets.get(path)
        if found is None:
            if len(self._assets) >= _PATH_CACHE_SIZE:
                self._assets.clear()  # bounded: an agent sees unbounded distinct paths
            found = self.config.asset_for(path) or _NO_ASSET
            self._assets[path] = found
        return found if isinstance(found, Asset) else None

    def in_maintenance(self, host: str | None, timestamp: Any) -> bool:
        if not self.windows or not isinstance(timestamp, str):
            return False
        if self._last_time[0] == timestamp:
            moment = self._last_time[1]
        else:
            try:
                moment = parse_time(timestamp)
            except ValueError:
                moment = None
            self._last_time = (timestamp, moment)
        return moment is not None and any(w.covers(host, moment) for w in self.windows)

    def apply(self, event: Event, host: str | None = None) -> None:
        """The policy fields of one event. This runs for every event a scan reads, so the
        common fields are decided inline, from one lookup each."""
        get = event.get
        if self.windows:
            maintenance = self.in_maintenance(host or get("host.name"), get("@timestamp"))
        else:
            maintenance = False
        event["hpcsec.in_maintenance"] = maintenance
        user = get("user.name")
        if user is not None:
            event["user.is_admin"] = user in self.admins
        uid = get("user.id")
        system = False  # only a system uid can run a GPU service
        if uid.__class__ is int or (isinstance(uid, int) and not isinstance(uid, bool)):
            system = event["user.is_system"] = uid < SYSTEM_UID_LIMIT
        executable = get("process.executable")
        if isinstance(executable, str) and executable:
            executable = executable.removesuffix(" (deleted)")  # upgraded while running
            name = executable[executable.rfind("/") + 1 :]  # posixpath.basename
            event["process.executable_name"] = name
            event["process.is_gpu_service"] = system and (
                executable in self.gpu_service_paths or name in self.gpu_service_names
            )
        elif get("process.name") is not None:
            event["process.is_gpu_service"] = system and self.is_gpu_service(event, None)
        preload = get("process.env.LD_PRELOAD")
        if isinstance(preload, str):
            event["process.ld_preload_allowed"] = preload_allowed(preload, self.preload_allowed)
        category = get("event.category")
        if category == "file_access":
            self._asset_fields(event, user)
        elif category == "firmware":
            self._firmware_fields(event)

    def is_gpu_service(self, event: Event, executable: str | None) -> bool:
        """A GPU service is a known executable run by root or a system account.

        Both are needed: anyone can name a copy of a binary `nv-hostengine`, or set its
        `comm` with `exec -a`, but only the site installs files under a path it lists and
        only root starts processes as a system uid. An entry with a `/` is an executable's
        path; one without is the executable's file name (not `comm`, which the kernel cuts at
        15 characters and the process can change). Without an executable (a replayed event
        that lacks it), `process.name` is compared with each name cut to 15 characters.
        (`apply` decides the common case inline, the same way.)
        """
        uid = event.get("user.id")
        if not isinstance(uid, int) or isinstance(uid, bool) or uid >= SYSTEM_UID_LIMIT:
            return False
        if executable is not None:
            return (
                executable in self.gpu_service_paths
                or posixpath.basename(executable) in self.gpu_service_names
            )
        name = event.get("process.name")
        return isinstance(name, str) and any(
            name == service[:COMM_MAX] for service in self.gpu_service_names
        )

    def _asset_fields(self, event: Event, user: str | None) -> None:
        # The file's own path: the one the opener used may be a bind mount or a hard link.
        path = event.get("hpcsec.asset.path") or event.get("file.path")
        if not isinstance(path, str):
            return
        asset = self.asset_for(path)
        if asset is None:
            return
        account = event.get("slurm.job.account")
        event["hpcsec.asset.name"] = asset.name
        event["hpcsec.asset.kind"] = asset.kind
        # A job whose details Slurm did not give (an id from the cgroup, but no owner, account
        # or partition) may be allowed by its account: undecided, so the fields stay absent
        # rather than `false`. A known job without an account simply has none.
        undecided = (
            event.get("slurm.job.id") is not None
            and account is None
            and event.get("slurm.job.user") is None
        ) or _job_unknown(event, asset)
        read = asset.readers.allows(user, account) or asset.writers.allows(user, account)
        write = asset.writers.allows(user, account)
        if read or not undecided:
            event["hpcsec.asset.read_allowed"] = read
        if write or not undecided:
            event["hpcsec.asset.write_allowed"] = write

    def _firmware_fields(self, event: Event) -> None:
        component, version = event.get("firmware.component"), event.get("firmware.version")
        if not isinstance(component, str) or version is None:
            return
        version = str(version)
        firmware = self.config.firmware
        baseline = event.get("firmware.baseline_version")
        if baseline is None:
            baseline = firmware.baseline(self.config.node_class, component)
            if baseline is not None:
                event["firmware.baseline_version"] = baseline
        if baseline is not None and "firmware.drift" not in event:
            event["firmware.drift"] = version != str(baseline)
        if "firmware.known_vulnerable" not in event:
            event["firmware.known_vulnerable"] = firmware.is_vulnerable(component, version)


def _job_unknown(event: Event, asset: Asset) -> bool:
    """The asset grants access by Slurm account, and whether the accessing process is in a
    job at all is unknown (Slurm did not answer, or the job is newer than the job list): the
    enrichment then leaves out `slurm.node.user_has_job` as well as `slurm.job.id`."""
    if not (asset.readers.accounts or asset.writers.accounts):
        return False
    return (
        event.get("slurm.job.id") is None
        and event.get("slurm.job.account") is None
        and "slurm.node.user_has_job" not in event
    )


def _system_library_dir(directory: str) -> bool:
    return _SYSTEM_LIB_DIR.match(directory) is not None


def _allowed_entry(library: str, allowed: Iterable[str]) -> bool:
    directory, name = posixpath.split(library)
    if posixpath.normpath(library) != library:  # `/usr/lib/../../home/u/x.so`
        return False
    for entry in allowed:
        if "/" in entry:
            if _path_glob_matches(entry, library):
                return True
        elif _system_library_dir(directory) and (name == entry or name.startswith(entry + ".")):
            return True
    return False


def _path_glob_matches(pattern: str, path: str) -> bool:
    """`pattern` matches `path` component by component (`*` never crosses a `/`)."""
    parts, names = pattern.split("/"), path.split("/")
    return len(parts) == len(names) and all(
        fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names, strict=True)
    )


def preload_allowed(value: str, allowed: Iterable[str]) -> bool:
    """Whether every library in an LD_PRELOAD value is allowed.

    ld.so splits LD_PRELOAD on spaces and colons and loads each entry, so each must pass on
    its own (`evil.so:/usr/lib/…/libjemalloc.so.2` does not). An allow-list entry with a `/`
    is an absolute path, `*` matching within one path component; a bare name (`libjemalloc`)
    allows that library (`libjemalloc.so`, `libjemalloc.so.2`, not `libjemalloc-hook.so`)
    in a system library directory only. An entry without a `/` in LD_PRELOAD is found
    through LD_LIBRARY_PATH, which the user sets: it is never allowed, nor is a value the
    sensor cut (`…[hpcsec: cut N bytes]`): what was cut is unknown.
    """
    if proclists.holds_cut(value):
        return False
    libraries = [item for item in re.split(r"[: ]+", value) if item]
    return bool(libraries) and all(
        library.startswith("/") and _allowed_entry(library, allowed) for library in libraries
    )


# Policies prepared per config object: the agent reloads the config on SIGHUP, so a handful
# of entries suffice; the config is kept alive with its policy so its id() stays unique.
_POLICIES: dict[int, tuple[SiteConfig, Policy]] = {}


def policy_for(config: SiteConfig) -> Policy:
    entry = _POLICIES.get(id(config))
    if entry is None or entry[0] is not config:
        if len(_POLICIES) >= 4:
            _POLICIES.clear()
        entry = (config, Policy(config))
        _POLICIES[id(config)] = entry
    return entry[1]


def annotate_fleet_majority(events: Iterable[Event]) -> int:
    """Set `firmware.fleet_majority_version` on firmware events, in place.

    The majority is taken per component over hosts (each host votes once per component and
    version, however many devices it has), and only where at least MIN_FLEET_HOSTS hosts
    report the component and one version is held by more than half of them. Returns the
    number of events annotated.
    """
    firmware = [
        e
        for e in events
        if e.get("event.category") == "firmware"
        and isinstance(e.get("firmware.component"), str)
        and e.get("firmware.version") is not None
        and e.get("host.name")
    ]
    hosts_by_version: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for e in firmware:
        hosts_by_version[e["firmware.component"]][str(e["firmware.version"])].add(e["host.name"])
    majority: dict[str, str] = {}
    for component, versions in hosts_by_version.items():
        hosts = set().union(*versions.values())
        if len(hosts) < MIN_FLEET_HOSTS:
            continue
        votes = Counter({v: len(h) for v, h in versions.items()})
        version, count = max(votes.items(), key=lambda item: (item[1], item[0]))
        if count * 2 > len(hosts):
            majority[component] = version
    annotated = 0
    for e in firmware:
        fleet_version = majority.get(e["firmware.component"])
        if fleet_version is not None:
            e["firmware.fleet_majority_version"] = fleet_version
            annotated += 1
    return annotated


def apply_fleet_majority(events: list[Event], majority: dict[str, str]) -> list[Event]:
    """`firmware.fleet_majority_version` from `majority` (per component, as
    `annotate_fleet_majority` found it over a whole file) on its firmware events, in place;
    a version an event already gives stays."""
    for event in events:
        if event.get("event.category") == "firmware":
            version = majority.get(str(event.get("firmware.component")))
            if version is not None:
                event.setdefault("firmware.fleet_majority_version", version)
    return events
