"""SigmaHQ-scale rule sets: thousands of rules against the pySigma SQLite backend's SQL.

    python -m bench sigmahq [--rules-dir DIR] [--events N] [--unique-events N] [--no-sqlite]

The rules are SigmaHQ's (`rules/`, `rules-emerging-threats/`, `rules-threat-hunting/`): DIR
holds them as files or as `rules.tar.xz` (default: $HPCSEC_SIGMAHQ, else ../shared/sigmahq
beside the repository; the bench says so and stops when they are absent). Their logsources
are other products': each (product, category, service) is routed to an hpcsec category of its
own, as a rule set from another product would be, so a rule sees only its source's events.

Events (default 100K) are generated from the rules themselves: each takes a random rule's
fields; about 1 in 20 carries that rule's literal values (most of those fire it), the others
carry benign values of the same fields. Reported in one run: load time (parse + compile); the
same rules through the rule cache in a fresh process (rule_load.py: cached load, each
category's first evaluation, steady state, rule memory); the engine's events/s and peak RSS,
with the literal index (index.py) and without (every rule of the category per event), and
whether both found exactly the same (event, rule) matches (the index may only skip rules that
cannot match: the bench fails when they differ). Two workloads: `repeated values`, the events
as generated (their benign values are drawn from a few dozen, so the index's memory of texts
it has seen answers most of them), and `unique values`, the first 50K (--unique-events) again
with every benign value made distinct (as under a flood of new values, where nothing is
remembered); the bench also fails when that changes which rules match. Then the SQLite
backend's SQL on sqlite3 over the repeated events (table load reported apart).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import multiprocessing
import os
import random
import resource
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from sigma.rule import SigmaDetection, SigmaDetectionItem, SigmaRule
from sigma.types import SigmaString

from hpcsec.detector.engine.evaluate import Engine, Match
from hpcsec.detector.engine.index import INDEX_MIN_RULES
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import RuleSet

from .engine import run_sqlite, sql_queries
from .rule_load import report as cached_load_report
from .rule_load import route

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO.parent / "shared" / "sigmahq"
PARTS = ("rules", "rules-emerging-threats", "rules-threat-hunting")
BENIGN = ["svchost", "explorer", "chrome", "python3", "bash", "systemd", "update", "backup"]
HIT_SHARE = 0.05
UNIQUE_EVENTS = 50_000
FIXED = ("event.category", "@timestamp")  # the bench's own fields, not a rule's


def children_cpu() -> float:
    """CPU seconds of the worker processes so far (a parse of many files), their exit
    included: each is waited for here (the load does not wait for its workers' exit)."""
    for worker in multiprocessing.active_children():
        worker.join()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rule_paths(given: Path, scratch: Path) -> list[Path]:
    archive = given / "rules.tar.xz"
    if archive.is_file():
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        given = scratch
    return [given / p for p in PARTS if (given / p).is_dir()] or [given]


def literal_items(detection: SigmaDetection) -> list[SigmaDetectionItem]:
    items: list[SigmaDetectionItem] = []
    for item in detection.detection_items:
        if isinstance(item, SigmaDetection):
            items += literal_items(item)
        elif item.field and item.value and isinstance(item.value[0], SigmaString):
            items.append(item)
    return items


def event_of(
    rule: SigmaRule, rng: random.Random, hit: bool, category: str | None
) -> dict[str, Any] | None:
    selections = [
        d for name, d in rule.detection.detections.items() if not name.startswith("filter")
    ]
    if not selections:
        return None
    event: dict[str, Any] = {"event.category": category}
    for item in literal_items(rng.choice(selections)):
        if hit:
            text = str(rng.choice(item.value)).replace("*", "").replace("?", "x")
        else:
            text = f"C:\\Program Files\\{rng.choice(BENIGN)}\\{rng.choice(BENIGN)}.exe"
        event.setdefault(str(item.field), text)
    return event


def generate(ruleset: RuleSet, n: int, seed: int = 15) -> tuple[list[dict[str, Any]], list[bool]]:
    """n events, and for each whether it carries benign values (the background)."""
    rng = random.Random(seed)
    rules = [r for r in ruleset.rules if r.kind == "detection"]
    events: list[dict[str, Any]] = []
    background: list[bool] = []
    while len(events) < n:
        rule = rng.choice(rules)
        hit = rng.random() < HIT_SHARE
        event = event_of(rule.sigma, rng, hit, rule.header.category)
        if event is not None:
            event["@timestamp"] = "2026-12-01T00:00:00Z"
            events.append(event)
            background.append(not hit)
    return events, background


def unique_values(events: list[dict[str, Any]], background: list[bool]) -> list[dict[str, Any]]:
    """The same events, each benign value made unlike any other by a counter directory
    (`C:\\Program Files\\bash\\7f3a\\bash.exe`): the start, the end and each name of the
    value stay as they were, so the same rules match (the bench checks it), but no text is
    ever met twice, as under a flood of distinct values (what the index remembers is no use)."""
    counter = itertools.count()
    unique: list[dict[str, Any]] = []
    for event, benign in zip(events, background, strict=True):
        if benign:
            event = {
                field: unique_text(value, next(counter))
                if field not in FIXED and isinstance(value, str)
                else value
                for field, value in event.items()
            }
        unique.append(event)
    return unique


def unique_text(text: str, n: int) -> str:
    head, _, name = text.rpartition("\\")
    return f"{head}\\{n:x}\\{name}"


MatchSet = set[tuple[tuple[int, ...], str]]  # (positions of the events, rule id)


def run_engine(engine: Engine, events: list[dict[str, Any]]) -> tuple[float, int]:
    cpu, found = run_matches(engine, events)
    return cpu, len(found)


def run_matches(engine: Engine, events: list[dict[str, Any]]) -> tuple[float, list[Match]]:
    start, found = time.process_time(), []
    for i in range(0, len(events), 256):
        found += engine.evaluate(events[i : i + 256])
    found += engine.flush()
    return time.process_time() - start, found


def match_set(found: list[Match], events: list[dict[str, Any]]) -> MatchSet:
    position = {id(event): n for n, event in enumerate(events)}
    return {(tuple(position[id(e)] for e in m.events), m.rule.id) for m in found}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sigmahq")
    parser.add_argument(
        "--rules-dir", type=Path, default=Path(os.environ.get("HPCSEC_SIGMAHQ", DEFAULT_DIR))
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument(
        "--unique-events",
        type=int,
        default=UNIQUE_EVENTS,
        help="how many of the events are run again with every benign value made unique",
    )
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite peer")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="events/s at 10 to 3,000 rules, with and without the index",
    )
    args = parser.parse_args(argv)
    if not args.rules_dir.is_dir():
        print(f"skipped: no SigmaHQ rules at {args.rules_dir} (--rules-dir or $HPCSEC_SIGMAHQ)")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        paths = rule_paths(args.rules_dir, Path(scratch))
        start, workers = time.process_time(), children_cpu()
        ruleset = load_rules(paths, collect_errors=True, with_tests=False)
        parsed, workers = time.process_time() - start, children_cpu() - workers
        categories = route(ruleset)
        start = time.process_time()
        engine = Engine(ruleset)
        # with the full collection its objects call for (the compile collects only its young
        # garbage): paid here, not by the first workload
        gc.collect()
        built = time.process_time() - start
        print(
            f"{len(ruleset.rules)} rules ({len(ruleset.errors)} not loaded), {categories} "
            f"categories: load {parsed + built:.2f} s CPU (parse {parsed:.2f} + {workers:.2f} "
            f"in worker processes, compile {built:.2f})"
        )
        events, background = generate(ruleset, args.events)
        cached_load(paths, events, Path(scratch))
        if args.scaling:
            scaling(ruleset, events)
            return 0
        plain = Engine(ruleset, index_min=10**9)
        same, repeated, rate = workload("repeated values", engine, plain, events)
        count = min(args.unique_events, len(events))
        if count > 0:
            unique = unique_values(events[:count], background[:count])
            same_unique, found_unique, _ = workload("unique values", engine, plain, unique)
            kept = {(positions, rule) for positions, rule in repeated if positions[-1] < count}
            print(
                f"unique values change no match: {found_unique == kept} "
                f"({len(found_unique):,} pairs; {len(kept):,} on the same events as generated)"
            )
            same = same and same_unique and found_unique == kept
        if not args.no_sqlite:
            sqlite_peer(ruleset, events, Path(scratch), rate)
    return 0 if same else 1


def workload(
    name: str, engine: Engine, plain: Engine, events: list[dict[str, Any]]
) -> tuple[bool, MatchSet, float]:
    """One workload through the indexed and the unindexed engine: events/s of each, whether
    both found the same (event, rule) pairs, those pairs and the indexed events/s."""
    gc.collect()  # what building the engines left: not the workload's
    cpu, found = run_matches(engine, events)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{name} ({len(events):,} events): engine, indexed: {len(events) / cpu:>10,.0f} "
        f"events/s  {len(found):,} matches  peak RSS {rss:.0f} MB"
    )
    gc.collect()
    cpu_plain, found_plain = run_matches(plain, events)
    print(
        f"{name} ({len(events):,} events): engine, unindexed: "
        f"{len(events) / cpu_plain:>10,.0f} events/s  {len(found_plain):,} matches  "
        f"(indexed is {cpu_plain / cpu:.1f}x)"
    )
    indexed = match_set(found, events)
    same = differential(indexed, match_set(found_plain, events))
    return same, indexed, len(events) / cpu


def differential(indexed: MatchSet, plain: MatchSet) -> bool:
    """The index may only skip rules that cannot match: both engines find the same pairs."""
    if indexed == plain:
        print(f"differential: indexed == unindexed, {len(indexed):,} (event, rule) matches")
        return True
    print(
        f"differential: MISMATCH, {len(plain - indexed):,} matches missed by the index, "
        f"{len(indexed - plain):,} found only by it; first: {sorted(plain ^ indexed)[:3]}"
    )
    return False


def cached_load(paths: list[Path], events: list[dict[str, Any]], scratch: Path) -> None:
    """The same rules through the rule cache, in a fresh process (rule_load.py)."""
    cache = scratch / "cache"
    cache.mkdir(mode=0o700)
    ruleset = load_rules(paths, with_tests=False, cache=cache, collect_errors=True)
    if ruleset.errors:
        print("cached load: skipped (a rule set with errors is not cached)")
        return
    events_file = scratch / "events-load.jsonl"
    events_file.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    cached_load_report(paths, cache, events_file)


def sqlite_peer(
    ruleset: RuleSet, events: list[dict[str, Any]], scratch: Path, engine_rate: float
) -> None:
    queries, failed = [], 0
    for rule in ruleset.rules:
        try:
            queries += sql_queries(RuleSet([rule]), {})
        except Exception:  # the backend refuses some SigmaHQ rules (a peer's limitation)
            failed += 1
    # SQLite's column names ignore case, and SigmaHQ spells some fields two ways (`FileName`,
    # `Filename`): one column per name whatever its case, under its first spelling
    spelling: dict[str, str] = {}
    for event in events:
        for field in event:
            spelling.setdefault(field.lower(), field)
    rows = [{spelling[f.lower()]: v for f, v in e.items()} for e in events]
    path = scratch / "events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in rows))
    fields = sorted(set(spelling.values()))
    load, cpu, matches, rejected = run_sqlite(path, fields, queries)
    rate = len(events) / cpu
    print(
        f"sqlite backend SQL: {rate:>10,.0f} events/s  {matches:,} matches  + {load:.1f} s table "
        f"load; {failed} rules not converted, {rejected} queries refused  "
        f"(engine is {engine_rate / rate:.1f}x)"
    )


def scaling(ruleset: RuleSet, events: list[dict[str, Any]]) -> None:
    """The first N rules (file order) against the same events: the index keeps the cost
    flat where evaluating every rule of the category grows with N."""
    for size in (10, 100, 300, 1000, 3000):
        subset = RuleSet(ruleset.rules[:size])
        rates = []
        for index_min in (INDEX_MIN_RULES, 10**9):
            cpu, _ = run_engine(Engine(subset, index_min=index_min), events)
            rates.append(len(events) / cpu)
        print(
            f"{size:>5} rules: indexed {rates[0]:>9,.0f} events/s  "
            f"unindexed {rates[1]:>9,.0f} events/s  ({rates[0] / rates[1]:.1f}x)"
        )
