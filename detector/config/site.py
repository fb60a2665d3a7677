"""The site config (a contract, see docs/config.md): what we protect and who may touch it.

Loaded from YAML with line numbers so `hpcsec config check` can say file, line and what is
wrong. Policy is applied at enrichment (detector/policy.py); rules only see the outcome and
the named thresholds (Sigma placeholders).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from hpcsec.detector.core import hostlist
from hpcsec.detector.core.errors import ConfigError, HpcsecError, location
from hpcsec.detector.core.schema import FIRMWARE_COMPONENTS, parse_time
from hpcsec.detector.core.yamlsrc import YamlDocument, load_documents

ASSET_KINDS = ("model", "dataset", "checkpoint", "secret")

# Named lists the bundled rules use through `|expand` placeholders, with the defaults that
# apply when the site config's `lists:` does not name them (a site list replaces the default).
# Every default is non-empty: pySigma refuses to expand a placeholder into no values.
DEFAULT_LISTS: dict[str, tuple[str, ...]] = {
    "miner_names": (
        "xmrig",
        "xmr-stak",
        "t-rex",
        "nbminer",
        "lolminer",
        "gminer",
        "phoenixminer",
        "ethminer",
        "nanominer",
        "teamredminer",
        "bzminer",
        "rigel",
        "srbminer-multi",
        "cpuminer",
        "ccminer",
        "excavator",
    ),
    "copy_tools": (
        "scp",
        "sftp",
        "rsync",
        "rclone",
        "curl",
        "wget",
        "aws",
        "gsutil",
        "azcopy",
        "s5cmd",
        "s3cmd",
        "nc",
        "ncat",
        "socat",
        "lftp",
        "ftp",
        "croc",
        "magic-wormhole",
    ),
    "flash_tools": (
        "flint",
        "mstflint",
        "mstfwmanager",
        "mlxfwmanager",
        "mlxburn",
        "nvflash",
        "nvfwupd",
        "fwupdmgr",
        "fwupdtool",
        "flashrom",
        "afulnx_64",
        "nvidia-smi-flash",
    ),
    "service_commands": (
        "jupyter",
        "ray start",
        "raylet",
        "gcs_server",
        "ray.dashboard",
        "vllm",
        "tritonserver",
        "text-generation-launcher",
        "ollama serve",
        "gradio",
        "streamlit",
        "tensorboard",
        "code-server",
    ),
    "slurm_daemons": ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "slurmrestd"),
    "ld_preload_allowed": (
        "libtcmalloc",
        "libjemalloc",
        "libdarshan",
        "libnvidia-ml",
        "libhugetlbfs",
        "libmimalloc",
        "libxalt",
        "libiomp5",
        "libtbbmalloc",
    ),
}


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
    return re.compile("".join(out) + r"\Z")


@dataclass(frozen=True)
class Asset:
    name: str
    kind: str
    paths: tuple[str, ...]
    readers: Principals = Principals()
    writers: Principals = Principals()
    line: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regexes", tuple(glob_to_regex(p) for p in self.paths))

    def covers(self, path: str) -> bool:
        return any(r.match(path) for r in self._regexes)  # type: ignore[attr-defined]

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


@dataclass(frozen=True)
class Silence:
    """Alerts matching every given matcher are stored, not sent, until `expires`."""

    rule_id: str | None = None
    host: str | None = None
    job: str | None = None
    user: str | None = None
    expires: datetime | None = None
    comment: str = ""

    def matches(self, alert: dict[str, Any], now: datetime) -> bool:
        if self.expires is not None and now >= self.expires:
            return False
        checks = (
            (self.rule_id, "rule.id"),
            (self.host, "host.name"),
            (self.job, "slurm.job.id"),
            (self.user, "user.name"),
        )
        return all(
            want is None or fnmatch.fnmatchcase(str(alert.get(key, "")), want)
            for want, key in checks
        )


@dataclass(frozen=True)
class FirmwarePolicy:
    baselines: dict[str, dict[str, str]] = field(default_factory=dict)
    vulnerable: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def baseline(self, node_class: str | None, component: str) -> str | None:
        return self.baselines.get(node_class or "", {}).get(component)

    def is_vulnerable(self, component: str, version: str) -> bool:
        return any(fnmatch.fnmatchcase(version, pat) for pat in self.vulnerable.get(component, ()))


@dataclass(frozen=True)
class SiteConfig:
    node_class: str | None = None
    assets: tuple[Asset, ...] = ()
    admins: Principals = Principals()
    gpu_services: tuple[str, ...] = ()
    maintenance: tuple[MaintenanceWindow, ...] = ()
    firmware: FirmwarePolicy = FirmwarePolicy()
    thresholds: dict[str, float | int | str] = field(default_factory=dict)
    lists: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    silences: tuple[Silence, ...] = ()
    rate_limit_per_rule: int = 0  # alerts per rule and minute sent; 0 = no limit
    dedup_window_s: int = 300
    spool_dir: str | None = None
    spool_max_bytes: int = 64 * 1024 * 1024
    store_path: str | None = None
    retention_days: int = 30
    interval_s: float = 10.0
    metrics_address: str = "127.0.0.1:9817"
    webhook_secret_file: str | None = None
    syslog_format: str = "json"  # json | cef
    path: str | None = None

    def asset_for(self, path: str) -> Asset | None:
        for asset in self.assets:
            if asset.covers(path):
                return asset
        return None

    def placeholders(self) -> dict[str, list[Any]]:
        """Values for Sigma `|expand` placeholders: thresholds and named lists."""
        values: dict[str, list[Any]] = {k: [v] for k, v in self.thresholds.items()}
        values.update({k: list(v) for k, v in self.lists.items()})
        values.setdefault("gpu_services", list(self.gpu_services))
        values.setdefault("admin_users", list(self.admins.users))
        for name, default in DEFAULT_LISTS.items():
            values.setdefault(name, list(default))
        return values


class _Reader:
    """Typed access to one document with errors that name the line."""

    def __init__(self, doc: YamlDocument):
        self.doc = doc

    def fail(self, message: str, *keys: str | int) -> ConfigError:
        return ConfigError(message, location(self.doc.path, self.doc.line_of(*keys)))

    def mapping(self, value: Any, *keys: str | int, allowed: tuple[str, ...] = ()) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{'.'.join(map(str, keys)) or 'config'} must be a mapping", *keys)
        for k in value:
            if allowed and k not in allowed:
                raise self.fail(
                    f"unknown key {k!r} (expected one of: {', '.join(allowed)})", *keys, k
                )
        return value

    def strings(self, value: Any, *keys: str | int) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{'.'.join(map(str, keys))} must be a list of strings", *keys)
        return tuple(value)

    def time(self, value: Any, *keys: str | int) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo else parse_time(value.isoformat())
        try:
            return parse_time(str(value))
        except ValueError:
            raise self.fail(
                f"{'.'.join(map(str, keys))}: not an RFC 3339 time: {value!r}", *keys
            ) from None

    def number(self, value: Any, *keys: str | int, minimum: float | None = None) -> float | int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(f"{'.'.join(map(str, keys))} must be a number, not {value!r}", *keys)
        if minimum is not None and value < minimum:
            raise self.fail(
                f"{'.'.join(map(str, keys))} must be at least {minimum:g}, not {value!r}", *keys
            )
        return value

    def principals(self, value: Any, *keys: str | int) -> Principals:
        m = self.mapping(value, *keys, allowed=("users", "accounts"))
        return Principals(
            self.strings(m.get("users"), *keys, "users"),
            self.strings(m.get("accounts"), *keys, "accounts"),
        )


TOP_LEVEL_KEYS = (
    "node_class",
    "assets",
    "admins",
    "gpu_services",
    "maintenance",
    "firmware",
    "thresholds",
    "lists",
    "outputs",
    "silences",
    "rate_limit_per_rule",
    "dedup_window_s",
    "spool",
    "store",
    "agent",
    "webhook_secret_file",
    "syslog_format",
)


OUTPUT_SCHEMES = ("syslog+udp", "syslog+tcp", "syslog+tls", "http", "https", "file")


def _output_urls(r: _Reader, value: Any) -> tuple[str, ...]:
    """The shape of each output URL, checked here so an error names its line; the output
    itself (secrets, certificates, ports) is checked when it is opened."""
    urls = r.strings(value, "outputs")
    for i, url in enumerate(urls):
        if url == "-":
            continue
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in OUTPUT_SCHEMES or not rest.strip("/"):
            raise r.fail(
                f"output {url!r} is not one of: syslog+udp|tcp|tls://HOST:PORT, "
                "http(s)://…, file:///PATH.jsonl, -",
                "outputs",
                i,
            )
    return urls


def parse_config(doc: YamlDocument) -> SiteConfig:
    r = _Reader(doc)
    top = r.mapping(doc.data, allowed=TOP_LEVEL_KEYS)
    assets = []
    raw_assets = top.get("assets") or []
    if not isinstance(raw_assets, list):
        raise r.fail("assets must be a list", "assets")
    names: set[str] = set()
    for i, item in enumerate(raw_assets):
        a = r.mapping(item, "assets", i, allowed=("name", "kind", "paths", "readers", "writers"))
        name = a.get("name")
        if not isinstance(name, str) or not name:
            raise r.fail("asset needs a name", "assets", i)
        if name in names:
            raise r.fail(f"duplicate asset name {name!r}", "assets", i, "name")
        names.add(name)
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
                r.principals(a.get("readers"), "assets", i, "readers"),
                r.principals(a.get("writers"), "assets", i, "writers"),
                doc.line_of("assets", i),
            )
        )
    windows = []
    for key in ("maintenance", "silences"):
        if not isinstance(top.get(key) or [], list):
            raise r.fail(f"{key} must be a list", key)
    for i, item in enumerate(top.get("maintenance") or []):
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
    fw = r.mapping(top.get("firmware"), "firmware", allowed=("baselines", "vulnerable"))
    baselines = {}
    for cls, comps in r.mapping(fw.get("baselines"), "firmware", "baselines").items():
        comps = r.mapping(comps, "firmware", "baselines", cls, allowed=FIRMWARE_COMPONENTS)
        for k, v in comps.items():
            if v is None or isinstance(v, (bool, list, dict)):
                raise r.fail(
                    f"firmware.baselines.{cls}.{k} must be a version string",
                    "firmware",
                    "baselines",
                    cls,
                    k,
                )
            if isinstance(v, float):  # YAML reads 2.10 as the number 2.1: the version is lost
                raise r.fail(
                    f"firmware.baselines.{cls}.{k}: quote the version ({v!r} was read "
                    "as a number, which drops trailing zeros)",
                    "firmware",
                    "baselines",
                    cls,
                    k,
                )
        baselines[str(cls)] = {str(k): str(v) for k, v in comps.items()}
    vulnerable = {
        str(k): r.strings(v, "firmware", "vulnerable", k)
        for k, v in r.mapping(
            fw.get("vulnerable"), "firmware", "vulnerable", allowed=FIRMWARE_COMPONENTS
        ).items()
    }
    thresholds = {}
    for k, v in r.mapping(top.get("thresholds"), "thresholds").items():
        thresholds[str(k)] = r.number(v, "thresholds", k)
    lists = {
        str(k): r.strings(v, "lists", k) for k, v in r.mapping(top.get("lists"), "lists").items()
    }
    for k, v in lists.items():
        if not v:  # pySigma cannot expand a placeholder into no values
            raise r.fail(f"lists.{k} must not be empty (remove it to use the default)", "lists", k)
    silences = []
    for i, item in enumerate(top.get("silences") or []):
        s = r.mapping(
            item, "silences", i, allowed=("rule_id", "host", "job", "user", "expires", "comment")
        )
        if not any(s.get(k) for k in ("rule_id", "host", "job", "user")):
            raise r.fail(
                "a silence needs at least one matcher (rule_id, host, job, user)", "silences", i
            )
        silences.append(
            Silence(
                *(
                    str(s[k]) if s.get(k) is not None else None
                    for k in ("rule_id", "host", "job", "user")
                ),
                expires=r.time(s["expires"], "silences", i, "expires")
                if s.get("expires")
                else None,
                comment=str(s.get("comment", "")),
            )
        )
    spool = r.mapping(top.get("spool"), "spool", allowed=("dir", "max_bytes"))
    store = r.mapping(top.get("store"), "store", allowed=("path", "retention_days"))
    agent = r.mapping(top.get("agent"), "agent", allowed=("interval_s", "metrics_address"))
    syslog_format = top.get("syslog_format", "json")
    if syslog_format not in ("json", "cef"):
        raise r.fail("syslog_format must be json or cef", "syslog_format")
    node_class = top.get("node_class")
    if node_class is not None and not isinstance(node_class, str):
        raise r.fail("node_class must be a string", "node_class")
    if node_class is not None and baselines and node_class not in baselines:
        raise r.fail(
            f"node_class {node_class!r} has no entry in firmware.baselines "
            f"(known: {', '.join(sorted(baselines))})",
            "node_class",
        )
    return SiteConfig(
        node_class=node_class,
        assets=tuple(assets),
        admins=r.principals(top.get("admins"), "admins"),
        gpu_services=r.strings(top.get("gpu_services"), "gpu_services"),
        maintenance=tuple(windows),
        firmware=FirmwarePolicy(baselines, vulnerable),
        thresholds=thresholds,
        lists=lists,
        outputs=_output_urls(r, top.get("outputs")),
        silences=tuple(silences),
        rate_limit_per_rule=int(
            r.number(top.get("rate_limit_per_rule", 0), "rate_limit_per_rule", minimum=0)
        ),
        dedup_window_s=int(r.number(top.get("dedup_window_s", 300), "dedup_window_s", minimum=1)),
        spool_dir=spool.get("dir"),
        spool_max_bytes=int(
            r.number(spool.get("max_bytes", 64 * 1024 * 1024), "spool", "max_bytes", minimum=1024)
        ),
        store_path=store.get("path"),
        retention_days=int(
            r.number(store.get("retention_days", 30), "store", "retention_days", minimum=1)
        ),
        interval_s=float(
            r.number(agent.get("interval_s", 10.0), "agent", "interval_s", minimum=0.1)
        ),
        metrics_address=str(agent.get("metrics_address", "127.0.0.1:9817")),
        webhook_secret_file=top.get("webhook_secret_file"),
        syslog_format=syslog_format,
        path=doc.path,
    )


def load_config(path: str | Path | None) -> SiteConfig:
    """The site config from `path`; the empty config when no path is given."""
    if path is None:
        return SiteConfig()
    try:
        docs = load_documents(path)
    except HpcsecError as exc:
        raise ConfigError(exc.message, exc.location) from None
    if len(docs) != 1:
        raise ConfigError(f"expected one YAML document, found {len(docs)}", location(path, 1))
    return parse_config(docs[0])
