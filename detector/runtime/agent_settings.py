"""What the agent runs with: its command line, and the generation loaded from it.

A generation is the pipeline (config, rules, engine, enricher) plus what decides whether a
reload must reopen the outputs or the store. It is built completely before it replaces the
running one, so a broken rule or config leaves the running generation in place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hpcsec.detector.alerts.stage import AlertStage
from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.runtime.endpoints import file_stamp
from hpcsec.detector.runtime.pipeline import Pipeline


@dataclass(frozen=True)
class AgentSettings:
    """The command line; each value, when set, wins over the config file's."""

    config_path: str | None = None
    rule_paths: tuple[str, ...] | None = None  # local rules, beside the config's and bundled
    default_rules: bool = True  # False: no bundled rules (--no-default-rules)
    outputs: tuple[str, ...] = ()
    secret_file: str | None = None
    spool_dir: str | None = None
    store_path: str | None = None
    interval_s: float | None = None
    metrics_address: str | None = None
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    etc_root: str = "/etc"
    sensors: tuple[str, ...] | None = None
    once_for_s: float | None = None
    drain_timeout_s: float = 10.0
    host_name: str | None = None
    min_level: str = "informational"  # alerts below it are stored, not sent


@dataclass(frozen=True)
class OutputsKey:
    """Everything the open outputs depend on: a reload reopens them when this changes."""

    urls: tuple[str, ...]
    secret: tuple[object, ...]  # file_stamp of the webhook secret: a rotated secret counts
    spool_dir: str | None
    syslog_format: str
    spool_max_bytes: int


@dataclass(frozen=True)
class StoreKey:
    path: str | None
    retention_days: int


@dataclass(frozen=True)
class Generation:
    """One consistent pipeline, and the outputs, store and interval it asks for."""

    pipeline: Pipeline
    outputs_key: OutputsKey
    store_key: StoreKey
    interval_s: float


def correlation_lateness(config: SiteConfig, interval_s: float) -> float:
    """How late an event may reach the agent's correlations: the config's allowance, by
    default two sampling intervals (a sample is read, queued and evaluated in that time)."""
    if config.correlation_lateness_s is not None:
        return config.correlation_lateness_s
    return 2 * interval_s


def load_generation(settings: AgentSettings, stage: AlertStage | None = None) -> Generation:
    """Config, rules and engine, fully built; raises HpcsecError (with file:line). `stage`:
    the running alert stage, which the new generation keeps (dedup and rate limits)."""
    config = load_config(settings.config_path)
    interval = settings.interval_s if settings.interval_s is not None else config.interval_s
    if interval <= 0:
        raise UsageError(f"the sampling interval must be positive, not {interval}")
    pipeline = Pipeline.load(
        config,
        settings.rule_paths,
        default_rules=settings.default_rules,
        stage=stage,
        contain_errors=True,
        lateness_s=correlation_lateness(config, interval),
        clock=time.time,  # a live stream: time moves on while it is idle
    )
    outputs_key = OutputsKey(
        tuple(settings.outputs or config.outputs),
        file_stamp(settings.secret_file or config.webhook_secret_file),
        settings.spool_dir or config.spool_dir,
        config.syslog_format,
        config.spool_max_bytes,
    )
    store_key = StoreKey(settings.store_path or config.store_path, config.retention_days)
    return Generation(pipeline, outputs_key, store_key, interval)
