"""The one pipeline every command runs: sources -> enrichment -> engine -> alert stage.

A `Pipeline` is one generation: a config and the rule set, engine, enricher and alert stage
built from it. `hpcsec scan` drives it synchronously over its batches and decides on the
alerts once at the end; the agent drives it from its bounded queue, decides as alerts appear
and swaps in a whole new generation on SIGHUP (keeping the alert stage, so dedup and rate
limits carry over). `hpcsec collect` uses the same batches and `enrich`, without an engine.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.alerts.stage import AlertStage
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import Event
from hpcsec.detector.engine import flush_parts, part_task, rulecache
from hpcsec.detector.engine.evaluate import Engine, Match
from hpcsec.detector.engine.loader import load_rules, rule_paths_for
from hpcsec.detector.engine.reorder import Clock
from hpcsec.detector.engine.ruleset import RuleSet
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.enrich.view import NodeView, capture_view
from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.cmdline_condense import Literals

logger = get_logger(__name__)


@dataclass(frozen=True)
class SourceBatch:
    """Events read together, and what enrichment needs about the node they were read on
    (None: events from a file, with no node to look at). `enriched`: the enrichment steps
    the source already applied (a worker process that parsed the events gave them site
    policy: see runtime/chunked.py); the pipeline runs only the others. `context`: events
    read with these that are not evaluated again (worker processes ran the rules on them:
    runtime/chunk_detect.py) but that enrichment relates these to."""

    events: list[Event]
    node: NodeView | None
    enriched: frozenset[str] = frozenset()
    context: list[Event] = field(default_factory=list)


def capture(ctx: SensorContext, events: list[Event]) -> tuple[NodeView, list[Event]]:
    """What enrichment will need about the node, read now, where and when the sensors read
    (the agent enriches later, in another thread), and the status records that reading
    produced (Slurm unreachable, back, unparsable): events of this sample, added once."""
    view = capture_view(ctx, events)
    return view, view.status_events()


def enrich(enricher: Enricher, batch: SourceBatch) -> list[Event]:
    """Slurm job and site-policy fields for a batch's events (the one place that enriches)."""
    if batch.context:  # enriched with the events, so that each step sees the whole batch
        enricher.enrich([*batch.events, *batch.context], batch.node, skip=batch.enriched)
        return batch.events
    return enricher.enrich(batch.events, batch.node, skip=batch.enriched)


def coalesce(batches: Sequence[SourceBatch]) -> list[SourceBatch]:
    """Consecutive batches read on the same node view, as one: some fields relate events of
    different sensors read at the same time, so a sample is enriched as a whole."""
    merged: list[SourceBatch] = []
    for batch in batches:
        if merged and merged[-1].node is batch.node and merged[-1].enriched == batch.enriched:
            merged[-1].events.extend(batch.events)
            merged[-1].context.extend(batch.context)
        else:
            merged.append(
                SourceBatch(list(batch.events), batch.node, batch.enriched, list(batch.context))
            )
    return merged


@dataclass(frozen=True)
class Processed:
    """What one step produced: the enriched events (for the store) and the new alerts."""

    events: list[Event]
    alerts: list[Alert]
    eval_s: float


@dataclass(frozen=True)
class Pipeline:
    """One consistent config + rule set + engine + enricher, and the alert stage they feed.

    `contain_errors`: a bug in enrichment or in the engine is logged and the step goes on
    (without enrichment, or without matches) instead of ending the process: the agent must
    keep watching the node; a scan would rather fail loudly.
    """

    config: SiteConfig
    ruleset: RuleSet
    engine: Engine
    enricher: Enricher
    stage: AlertStage
    contain_errors: bool = False

    @classmethod
    def load(
        cls,
        config: SiteConfig,
        rule_paths: Sequence[str] | None,
        *,
        default_rules: bool = True,
        stage: AlertStage | None = None,
        dedup: bool = True,
        contain_errors: bool = False,
        lateness_s: float | None = None,
        clock: Clock | None = None,
    ) -> Pipeline:
        """Rules (see `rule_paths_for`) and engine, fully built; raises HpcsecError with
        file:line. Without the rules' test events: a slip in a tests file must not stop
        detection. `lateness_s`/`clock`: how correlations wait for late events (None: the
        whole input is put in event-time order, as `scan` does; see engine/reorder.py)."""
        ruleset = _ruleset(config, rule_paths, default_rules)
        engine = Engine(
            ruleset,
            placeholders=config.placeholders(),
            lateness=lateness_s,
            clock=clock,
            code_cache=rulecache.default_dir(),
        )
        return cls(
            config,
            ruleset,
            engine,
            Enricher(config),
            stage or AlertStage(config, dedup=dedup),
            contain_errors,
        )

    @functools.cached_property
    def cmdline_literals(self) -> Literals:
        """What the rules look for in a command line, for the process sensor to keep from a
        long one (sensors/cmdline_condense.py); made once per pipeline (a reload makes a new
        one)."""
        return Literals(self.engine.command_line_literals())

    def enrich(self, batch: SourceBatch) -> list[Event]:
        if not self.contain_errors:
            return enrich(self.enricher, batch)
        try:
            return enrich(self.enricher, batch)
        except Exception as exc:  # an enrichment bug must not cost the events
            logger.exception(
                "enrichment failed, evaluating without it: %s: %s", type(exc).__name__, exc
            )
            return batch.events

    def evaluate(self, events: list[Event]) -> list[Match]:
        if not self.contain_errors:
            return self.engine.evaluate(events)
        try:
            return self.engine.evaluate(events)
        except Exception as exc:  # an engine bug: say so loudly, keep the process running
            logger.exception(
                "rule evaluation failed on %d events: %s: %s", len(events), type(exc).__name__, exc
            )
            return []

    def process(self, batches: Sequence[SourceBatch]) -> Processed:
        """Enrich each batch (a sample as a whole), evaluate them together, fold the matches
        into alerts; returns the events and the alerts that are new."""
        events: list[Event] = []
        for batch in coalesce(batches):
            events.extend(self.enrich(batch))
        started = time.perf_counter()
        matches = self.evaluate(events)
        eval_s = time.perf_counter() - started
        return Processed(events, self.stage.fold(matches), eval_s)

    def flush(self, pool: ProcessPoolExecutor | None = None, workers: int = 0) -> list[Alert]:
        """Close the rules' open windows (correlations); returns the alerts that are new.
        `pool`: `workers` processes that may take a share of a long pass (flush_parts.py)."""
        if pool is None:
            return self.stage.fold(self.engine.flush())

        def submit(task: part_task.PartTask) -> Future[part_task.PartResult]:
            return pool.submit(part_task.run_part, task)

        return self.stage.fold(flush_parts.flush(self.engine, submit, workers))


def rule_literals(config: SiteConfig, rule_paths: Sequence[str] | None) -> Literals:
    """What the rules `Pipeline.load` would load look for in a command line, without
    building their match functions: for `collect`, which evaluates nothing but records
    command lines a scan may read later. Raises HpcsecError as Pipeline.load does."""
    engine = Engine(_ruleset(config, rule_paths), placeholders=config.placeholders(), lazy=True)
    return Literals(engine.command_line_literals())


def _ruleset(
    config: SiteConfig, rule_paths: Sequence[str] | None, default_rules: bool = True
) -> RuleSet:
    """The rules of `rule_paths_for`, through the rule cache, without their test events."""
    return load_rules(
        rule_paths_for(config, rule_paths, default_rules=default_rules),
        with_tests=False,
        threshold_values=config.thresholds,
        cache=rulecache.default_dir(),
    )
