"""The site config (a contract, see docs/config.md): what we protect and who may touch it.

Loaded from YAML with line numbers so `hpcsec config check` can say file, line and what is
wrong. Policy is applied at enrichment (detector/enrich/policy.py); rules only see the
outcome and the named thresholds (Sigma placeholders). Each section has its own module
(policy, lists, firmware, outputs); this one assembles them into `SiteConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcsec.detector.config import doccache
from hpcsec.detector.config.firmware import FirmwarePolicy, parse_firmware
from hpcsec.detector.config.lists import DEFAULT_LISTS, parse_lists
from hpcsec.detector.config.outputs import (
    OutputSettings,
    Silence,
    parse_output_settings,
    parse_output_urls,
    parse_silences,
)
from hpcsec.detector.config.policy import (
    ASSET_KINDS,
    Asset,
    MaintenanceWindow,
    Principals,
    glob_to_regex,
    parse_assets,
    parse_maintenance,
    parse_principals,
)
from hpcsec.detector.config.reader import ConfigReader
from hpcsec.detector.core.display import redacted_url
from hpcsec.detector.core.errors import ConfigError, HpcsecError, location
from hpcsec.detector.core.yamldoc import YamlDocument

# The section types are importable from here too: `site` is the config's public face.
__all__ = [
    "ASSET_KINDS",
    "DEFAULT_LISTS",
    "TOP_LEVEL_KEYS",
    "Asset",
    "FirmwarePolicy",
    "MaintenanceWindow",
    "Principals",
    "Silence",
    "SiteConfig",
    "glob_to_regex",
    "load_config",
    "parse_config",
]

# Upper bounds: beyond them a value is a typo or an attempt to switch something off, and a
# huge number overflows the windows and sizes computed from it.
THRESHOLD_MAX = 1e12
WINDOW_MAX_S = 7 * 86400
RATE_MAX = 1_000_000
SPOOL_MAX_BYTES = 1 << 40
# The longest a correlation may wait for late events: a day (more is a typo, not a policy).
MAX_LATENESS_S = 86400.0

TOP_LEVEL_KEYS = (
    "node_class",
    "rules",
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
    "correlation_lateness_s",
    "spool",
    "store",
    "agent",
    "cluster",
    "webhook_secret_file",
    "syslog_format",
)


@dataclass(frozen=True)
class SiteConfig:
    node_class: str | None = None
    # local rule files and directories, loaded beside the bundled rules (relative paths are
    # taken from the config file's directory)
    rule_paths: tuple[str, ...] = ()
    assets: tuple[Asset, ...] = ()
    admins: Principals = field(default_factory=Principals)
    gpu_services: tuple[str, ...] = ()
    maintenance: tuple[MaintenanceWindow, ...] = ()
    firmware: FirmwarePolicy = field(default_factory=FirmwarePolicy)
    thresholds: dict[str, float | int | str] = field(default_factory=dict)
    lists: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    output_settings: tuple[OutputSettings, ...] = ()  # the `outputs:` entries with `url:`
    silences: tuple[Silence, ...] = ()
    rate_limit_per_rule: int = 0  # alerts per rule and minute sent; 0 = no limit
    dedup_window_s: int = 300
    # how late (seconds of event time) the agent still correlates an event; None: two intervals
    correlation_lateness_s: float | None = None
    spool_dir: str | None = None
    spool_max_bytes: int = 64 * 1024 * 1024
    store_path: str | None = None
    retention_days: int = 30
    interval_s: float = 10.0
    metrics_address: str = "127.0.0.1:9817"
    # agent.sensor_budget_s: seconds per sampled sensor ("*": every sensor); unset: half the
    # interval (detector/runtime/threads.py)
    sensor_budget_s: dict[str, float] = field(default_factory=dict)
    webhook_secret_file: str | None = None
    syslog_format: str = "json"  # json | cef
    # NATS servers of the cluster tier: the agent also publishes there (docs/cluster.md)
    cluster_nats: tuple[str, ...] = ()
    path: str | None = None
    # `thresholds.NAME` / `lists.NAME` -> its line, for errors about names no rule uses
    name_lines: dict[str, int] = field(default_factory=dict, compare=False)

    def asset_for(self, path: str) -> Asset | None:
        for asset in self.assets:
            if asset.covers(path):
                return asset
        return None

    def list_values(self, name: str) -> tuple[str, ...]:
        """A named list: the site's, else the built-in default."""
        return self.lists.get(name, DEFAULT_LISTS.get(name, ()))

    def placeholders(self) -> dict[str, list[Any]]:
        """Values for Sigma `|expand` placeholders: thresholds and named lists."""
        values: dict[str, list[Any]] = {k: [v] for k, v in self.thresholds.items()}
        values.update({k: list(v) for k, v in self.lists.items()})
        values.setdefault("gpu_services", list(self.gpu_services))
        values.setdefault("admin_users", list(self.admins.users))
        for name, default in DEFAULT_LISTS.items():
            values.setdefault(name, list(default))
        return values


def _node_class(r: ConfigReader, value: Any, firmware: FirmwarePolicy) -> str | None:
    if value is not None and not isinstance(value, str):
        raise r.fail("node_class must be a string", "node_class")
    if value is not None and firmware.baselines and value not in firmware.baselines:
        raise r.fail(
            f"node_class {value!r} has no entry in firmware.baselines "
            f"(known: {', '.join(sorted(firmware.baselines))})",
            "node_class",
        )
    return value


def _sensor_budgets(r: ConfigReader, value: Any) -> dict[str, float]:
    """`agent.sensor_budget_s`: one number for every sampled sensor, or sensor name -> seconds
    (names are the sensors of `hpcsec collect --list`; `*` is every other sensor)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        return {"*": float(r.number(value, "agent", "sensor_budget_s", minimum=0.01))}
    budgets = r.mapping(value, "agent", "sensor_budget_s")
    return {
        str(name): float(r.number(seconds, "agent", "sensor_budget_s", name, minimum=0.01))
        for name, seconds in budgets.items()
    }


def _delivery(r: ConfigReader, top: dict) -> dict[str, Any]:
    """The SiteConfig fields of sending and keeping alerts and of the agent loop."""
    spool = r.mapping(top.get("spool"), "spool", allowed=("dir", "max_bytes"))
    store = r.mapping(top.get("store"), "store", allowed=("path", "retention_days"))
    agent = r.mapping(
        top.get("agent"), "agent", allowed=("interval_s", "metrics_address", "sensor_budget_s")
    )
    syslog_format = top.get("syslog_format", "json")
    if syslog_format not in ("json", "cef"):
        raise r.fail("syslog_format must be json or cef", "syslog_format")
    limit = r.number(
        top.get("rate_limit_per_rule", 0), "rate_limit_per_rule", minimum=0, maximum=RATE_MAX
    )
    dedup = r.number(
        top.get("dedup_window_s", 300), "dedup_window_s", minimum=1, maximum=WINDOW_MAX_S
    )
    spool_max = r.number(
        spool.get("max_bytes", 64 * 1024 * 1024),
        "spool",
        "max_bytes",
        minimum=1024,
        maximum=SPOOL_MAX_BYTES,
    )
    retention = r.number(
        store.get("retention_days", 30), "store", "retention_days", minimum=1, maximum=36500
    )
    interval = r.number(
        agent.get("interval_s", 10.0), "agent", "interval_s", minimum=0.1, maximum=86400
    )
    lateness = top.get("correlation_lateness_s")
    if lateness is not None:
        lateness = float(
            r.number(lateness, "correlation_lateness_s", minimum=0, maximum=MAX_LATENESS_S)
        )
    return {
        "rate_limit_per_rule": int(limit),
        "dedup_window_s": int(dedup),
        "correlation_lateness_s": lateness,
        "spool_dir": spool.get("dir"),
        "spool_max_bytes": int(spool_max),
        "store_path": store.get("path"),
        "retention_days": int(retention),
        "interval_s": float(interval),
        "metrics_address": str(agent.get("metrics_address", "127.0.0.1:9817")),
        "sensor_budget_s": _sensor_budgets(r, agent.get("sensor_budget_s")),
        "webhook_secret_file": top.get("webhook_secret_file"),
        "syslog_format": syslog_format,
    }


def _rule_paths(r: ConfigReader, value: Any) -> tuple[str, ...]:
    """`rules:` paths, relative ones taken from the config file's directory (not from where
    the agent happens to be started)."""
    paths = r.strings(value, "rules")
    if any(not p for p in paths):
        raise r.fail("rules: a path must not be empty", "rules")
    base = Path(r.doc.path).parent if r.doc.path else Path()
    return tuple(str(base / p) for p in paths)


NATS_SCHEMES = ("nats", "tls")


def _cluster(r: ConfigReader, value: Any) -> tuple[str, ...]:
    """`cluster: {nats: [URL, ...]}`: the servers of one NATS cluster (nats:// or tls://)."""
    cluster = r.mapping(value, "cluster", allowed=("nats",))
    urls = r.strings(cluster.get("nats"), "cluster", "nats")
    for i, url in enumerate(urls):
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in NATS_SCHEMES or not rest.strip("/"):
            raise r.fail(
                f"NATS server {redacted_url(url)!r} is not nats://HOST:PORT or tls://HOST:PORT",
                "cluster",
                "nats",
                i,
            )
    return urls


def parse_config(doc: YamlDocument) -> SiteConfig:
    # Sections are read in document order of importance, so with several mistakes the
    # first one reported is the one `config check` always reported first.
    r = ConfigReader(doc)
    top = r.mapping(doc.data, allowed=TOP_LEVEL_KEYS)
    assets = parse_assets(r, top.get("assets"))
    for key in ("maintenance", "silences"):
        r.items(top.get(key), key)
    maintenance = parse_maintenance(r, top.get("maintenance"))
    firmware = parse_firmware(r, top.get("firmware"))
    thresholds = {
        str(k): r.number(v, "thresholds", k, minimum=0, maximum=THRESHOLD_MAX)
        for k, v in r.mapping(top.get("thresholds"), "thresholds").items()
    }
    name_lines = {
        f"{section}.{k}": doc.line_of(section, k)
        for section in ("thresholds", "lists")
        for k in (top.get(section) or {})
    }
    lists = parse_lists(r, top.get("lists"))
    silences = parse_silences(r, top.get("silences"))
    delivery = _delivery(r, top)
    node_class = _node_class(r, top.get("node_class"), firmware)
    return SiteConfig(
        node_class=node_class,
        rule_paths=_rule_paths(r, top.get("rules")),
        assets=assets,
        admins=parse_principals(r, top.get("admins"), "admins"),
        gpu_services=r.strings(top.get("gpu_services"), "gpu_services"),
        maintenance=maintenance,
        firmware=firmware,
        thresholds=dict(thresholds),
        lists=lists,
        outputs=parse_output_urls(r, top.get("outputs")),
        output_settings=parse_output_settings(r, top.get("outputs")),
        silences=silences,
        cluster_nats=_cluster(r, top.get("cluster")),
        path=doc.path,
        name_lines=name_lines,
        **delivery,
    )


def load_config(path: str | Path | None, *, cache: bool = True) -> SiteConfig:
    """The site config from `path`; the empty config when no path is given. With `cache`, a
    file read before with the same bytes comes from the parsed-config cache (doccache.py)."""
    if path is None:
        return SiteConfig()
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", location(source)) from None
    directory = doccache.default_dir() if cache else None
    cached = doccache.read(directory, raw, source) if directory else None
    if cached is not None:
        return parse_config(cached)
    doc = _parse_document(raw, source)
    config = parse_config(doc)
    if directory:  # only a config that parsed and validated cleanly is kept
        doccache.write(directory, raw, doc)
    return config


def _parse_document(raw: bytes, source: str) -> YamlDocument:
    # Imported here, on a cache miss only: PyYAML is the largest import of a command that
    # reads a config, and a warm cache needs none of it.
    from hpcsec.detector.core.yamlsrc import decode_source, load_text_documents

    try:
        docs = load_text_documents(decode_source(raw, source), source)
    except HpcsecError as exc:
        raise ConfigError(exc.message, exc.location) from None
    if len(docs) != 1:
        raise ConfigError(f"expected one YAML document, found {len(docs)}", location(source, 1))
    return docs[0]
