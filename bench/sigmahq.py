"""SigmaHQ-scale rule sets: thousands of rules against the pySigma SQLite backend's SQL.

    python -m bench sigmahq [--rules-dir DIR] [--events N] [--no-sqlite]

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
cannot match: the bench fails when they differ); then the SQLite backend's SQL on sqlite3 over
the same events (table load reported apart).
"""

from __future__ import annotations

import argparse
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


def children_cpu() -> float:
    """CPU seconds of the worker processes waited for so far (a parse of many files)."""
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


def generate(ruleset: RuleSet, n: int, seed: int = 15) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rules = [r for r in ruleset.rules if r.kind == "detection"]
    events: list[dict[str, Any]] = []
    while len(events) < n:
        rule = rng.choice(rules)
        event = event_of(rule.sigma, rng, rng.random() < HIT_SHARE, rule.header.category)
        if event is not None:
            event["@timestamp"] = "2026-12-01T00:00:00Z"
            events.append(event)
    return events


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
        built = time.process_time() - start
        print(
            f"{len(ruleset.rules)} rules ({len(ruleset.errors)} not loaded), {categories} "
            f"categories: load {parsed + built:.2f} s CPU (parse {parsed:.2f} + {workers:.2f} "
            f"in worker processes, compile {built:.2f})"
        )
        events = generate(ruleset, args.events)
        cached_load(paths, events, Path(scratch))
        if args.scaling:
            scaling(ruleset, events)
            return 0
        cpu, found = run_matches(engine, events)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"engine, indexed:   {len(events) / cpu:>10,.0f} events/s  {len(found):,} matches  "
            f"peak RSS {rss:.0f} MB"
        )
        plain = Engine(ruleset, index_min=10**9)
        cpu_plain, found_plain = run_matches(plain, events)
        print(
            f"engine, unindexed: {len(events) / cpu_plain:>10,.0f} events/s  "
            f"{len(found_plain):,} matches  (indexed is {cpu_plain / cpu:.1f}x)"
        )
        same = differential(match_set(found, events), match_set(found_plain, events))
        if not args.no_sqlite:
            sqlite_peer(ruleset, events, Path(scratch), len(events) / cpu)
    return 0 if same else 1


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
