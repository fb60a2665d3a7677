"""Load figures of a large rule set, each load in a fresh process.

`python -m bench rule_load [--rules-dir DIR]` (SigmaHQ's rules, found as `bench sigmahq` finds
them) loads them with no cache, into an empty rule cache (every file parsed, in worker
processes beside the caller, and written), from the warm cache, and from the cache after one
rule file changed (that file alone is parsed): CPU of the loading process and of its workers,
and wall time (noisy on a shared machine; CPU is the figure to compare). `--phases`: the CPU
of each phase of a cold parse per file (YAML, pySigma, conditions, pickling an entry and
unpickling it), in one process: what each process pays for each file of its share.

`python -m bench sigmahq` runs `report` after its cold load: the rules are written to a scratch
rule cache, the events to a JSONL file, and a new interpreter (so that nothing is imported
or in memory yet) reports, in CPU seconds (process_time):
- cached load: the imports load_rules needs, then reading the entry (rule headers only;
  each rule's pySigma object is unpickled when its category is first compiled);
- engine: building a lazy Engine (correlations wired, no category compiled yet);
- first evaluation: each category's match function is built at its first event; the sum
  and the slowest of those first evaluations (the compile cost the cold load paid up front),
  once with the generated code compiled and kept, once with it read back from the code cache
  (codecache.py), as at every later start of `scan` or the agent;
- steady state: the events again, every category built, against the same events' first pass;
- memory: resident set now (not the peak) before the rules are loaded (events already read)
  and after the whole evaluation: their difference is what the rules cost.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpcsec.detector.engine.ruleset import RuleSet

BATCH = 256


def route(ruleset: RuleSet) -> int:
    """Each logsource to a category of its own (product hpc); returns how many categories.
    Through the rules' headers: a cached rule's pySigma object stays unread until compiled."""
    categories = set()
    for i, rule in enumerate(ruleset.rules):
        if rule.kind != "detection":
            continue
        header = rule.header
        name = "_".join(p or "" for p in (header.product, header.category, header.service))
        ruleset.rules[i] = rule.rerouted("hpc", name)
        categories.add(name)
    return len(categories)


def rss_mb() -> float:
    """Resident set size now (Linux), in MB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cached_figures(
    files: list[str], cache: str, events_file: str, code_cache: str
) -> dict[str, Any]:
    import orjson

    events = [orjson.loads(line) for line in Path(events_file).read_bytes().splitlines()]
    before = rss_mb()
    start = time.process_time()
    from hpcsec.detector.engine.loader import load_rules

    imported = time.process_time() - start
    start = time.process_time()
    ruleset = load_rules(files, with_tests=False, cache=Path(cache), collect_errors=True)
    read = time.process_time() - start
    pysigma_imported = "sigma.rule" in sys.modules
    after_load = rss_mb()
    from hpcsec.detector.engine.evaluate import Engine  # the compiler needs pySigma's types

    route(ruleset)
    start = time.process_time()
    engine = Engine(ruleset, lazy=True, code_cache=Path(code_cache))  # as the pipeline's
    built = time.process_time() - start
    firsts: list[float] = []
    matches = 0
    start_all = time.process_time()
    for i in range(0, len(events), BATCH):
        for event in events[i : i + BATCH]:
            if event["event.category"] in engine.built_categories:
                continue
            start = time.process_time()
            matches += len(engine.evaluate([event]))
            firsts.append(time.process_time() - start)
        matches += len(engine.evaluate(events[i : i + BATCH]))
    gc.collect()  # the full collection the compiles call for (they collect only their young)
    first_pass = time.process_time() - start_all
    start = time.process_time()
    for i in range(0, len(events), BATCH):
        engine.evaluate(events[i : i + BATCH])
    steady = time.process_time() - start
    return {
        "rules": len(ruleset.rules),
        "import": imported,
        "read": read,
        "pysigma_imported": pysigma_imported,
        "engine": built,
        "categories": len(firsts),
        "first_sum": sum(firsts),
        "first_max": max(firsts, default=0.0),
        "first_pass": first_pass,
        "steady": steady,
        "events": len(events),
        "rss_before": before,
        "rss_loaded": after_load,
        "rss_after": rss_mb(),
    }


def report(files: list[Path], cache: Path, events_file: Path) -> None:
    """Run cached_figures in a fresh interpreter and print them: twice, the generated match
    code first compiled and kept (codecache.py), then read back, as at every later start of
    `scan` or the agent."""
    code = (
        "import json, sys; from bench.rule_load import cached_figures; "
        "print(json.dumps(cached_figures(*json.loads(sys.argv[1]))))"
    )
    code_cache = cache / "code"
    code_cache.mkdir(mode=0o700, exist_ok=True)
    arg = json.dumps([[str(f) for f in files], str(cache), str(events_file), str(code_cache)])
    root = Path(__file__).resolve().parent.parent
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", code, arg], cwd=root, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, f = runs
    print(
        f"cached load: {f['import'] + f['read']:.2f} s CPU (imports {f['import']:.2f}, read "
        f"{f['read']:.2f}; pySigma's parser imported: {f['pysigma_imported']}), lazy engine "
        f"{f['engine']:.3f} s"
    )
    for name, run in (("code compiled", cold), ("code cached", f)):
        print(
            f"first evaluation of each of {run['categories']} categories ({name}): "
            f"{run['first_sum']:.2f} s CPU in all, slowest {run['first_max']:.3f} s; "
            f"{run['events']:,} events: first pass {run['first_pass']:.2f} s, steady state "
            f"{run['steady']:.2f} s"
        )
    print(
        f"rule memory: RSS {f['rss_before']:.0f} MB before load (events read), "
        f"{f['rss_loaded']:.0f} MB loaded, {f['rss_after']:.0f} MB after every category ran "
        f"(rules: {f['rss_after'] - f['rss_before']:.0f} MB)"
    )


# -- `python -m bench rule_load`: cold, cached and one-file-changed loads ---------------------

LOAD_CODE = """
import json, multiprocessing, resource, sys, time
from pathlib import Path
wall, cpu = time.perf_counter(), time.process_time()
from hpcsec.detector.engine.loader import load_rules
paths, cache = json.loads(sys.argv[1])
ruleset = load_rules(paths, with_tests=False, collect_errors=True,
                     cache=Path(cache) if cache else None)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
for worker in multiprocessing.active_children():  # the load does not wait for their exit
    worker.join()
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu": cpu, "wall": wall,
                  "workers_cpu": children.ru_utime + children.ru_stime,
                  "rules": len(ruleset.rules), "errors": len(ruleset.errors)}))
"""


def fresh_load(paths: list[Path], cache: Path | None) -> dict[str, Any]:
    """load_rules in a new interpreter (imports included): CPU of the process and of its
    worker processes (their exit included, which the load does not wait for), and wall time
    until load_rules returned."""
    arg = json.dumps([[str(p) for p in paths], str(cache) if cache else ""])
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", LOAD_CODE, arg], cwd=root, capture_output=True, text=True, check=True
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


PHASES_CODE = """
import json, sys, time
from collections import defaultdict
from pathlib import Path
start = time.process_time()
from hpcsec.detector.engine import coldload, correlation_rules, parse, rulecache
from hpcsec.detector.engine.memory import gc_paused
from hpcsec.detector.engine.loader import rule_sources
from hpcsec.detector.engine.ruleset import RuleSet
cpu = defaultdict(float)
cpu["imports"] = time.process_time() - start
def timed(owner, name, phase):
    real = getattr(owner, name)
    def measured(*args, **kwargs):
        start = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            cpu[phase] += time.process_time() - start
    setattr(owner, name, measured)
timed(coldload, "load_documents", "YAML (libyaml compose, lines)")
timed(parse.SigmaRule, "from_dict", "pySigma SigmaRule.from_dict")
timed(parse, "condition_errors", "conditions parsed")
timed(parse, "regex_errors", "regexes checked (RE2)")
files = list(rule_sources([Path(p) for p in json.loads(sys.argv[1])], []))
with gc_paused():
    start = time.process_time()
    parts = []
    for path in files:
        parts.append(RuleSet())
        coldload.load_file(path, parts[-1])
    cpu["parse in all"] = time.process_time() - start
    start = time.process_time()
    rules = [rule for part in parts for rule in part.rules]
    for rule in rules:
        rule.header
    cpu["headers"] = time.process_time() - start
    start = time.process_time()
    entries = [
        rulecache.encode(part, [correlation_rules.references_of(r) for r in part.rules])
        for part in parts
    ]
    cpu["entries pickled"] = time.process_time() - start
    start = time.process_time()
    for entry in entries:
        for rule in rulecache.decode_entry(entry).ruleset.rules:
            rule.sigma
    cpu["entries unpickled"] = time.process_time() - start
print(json.dumps({"files": len(files), "rules": len(rules), "cpu": cpu}))
"""


def phases(paths: list[Path]) -> None:
    """CPU of each phase of a cold parse, one process, every file in turn (GC paused, as in
    a load): what a worker and the caller each pay per file of their share."""
    arg = json.dumps([str(p) for p in paths])
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", PHASES_CODE, arg],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    f = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"cold parse of {f['files']} files ({f['rules']} rules), one process:")
    for phase, seconds in f["cpu"].items():
        per_file = f" {1000 * seconds / f['files']:6.3f} ms per file" if phase != "imports" else ""
        print(f"  {phase:<30} {seconds:6.2f} s CPU{per_file}")


def _line(what: str, f: dict[str, Any], peer: dict[str, Any] | None = None) -> str:
    total = f["cpu"] + f["workers_cpu"]
    ratio = ""
    if peer:
        ratio = f"; {(peer['cpu'] + peer['workers_cpu']) / total:.1f}x less CPU than no cache"
    return (
        f"{what:<20} {f['cpu']:6.2f} s CPU + {f['workers_cpu']:5.2f} s in workers, "
        f"{f['wall']:6.2f} s wall; {f['rules']} rules, {f['errors']} errors{ratio}"
    )


def main(argv: list[str]) -> int:
    """Load times of a large rule set (SigmaHQ's, as `bench sigmahq` finds it), each load in
    a fresh interpreter: no cache; an empty cache (parse and write the entries); the warm
    cache; the warm cache after one rule file of the set changed."""
    import argparse
    import tempfile

    from .sigmahq import DEFAULT_DIR, rule_paths

    parser = argparse.ArgumentParser(prog="python -m bench rule_load")
    parser.add_argument(
        "--rules-dir", type=Path, default=Path(os.environ.get("HPCSEC_SIGMAHQ", DEFAULT_DIR))
    )
    parser.add_argument(
        "--phases", action="store_true", help="CPU of each phase of a cold parse, per file"
    )
    args = parser.parse_args(argv)
    if not args.rules_dir.is_dir():
        print(f"skipped: no SigmaHQ rules at {args.rules_dir} (--rules-dir or $HPCSEC_SIGMAHQ)")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        paths = rule_paths(args.rules_dir, Path(scratch) / "rules")
        cache = Path(scratch) / "cache"
        if args.phases:
            phases(paths)
            return 0
        cold = fresh_load(paths, None)
        print(_line("cold, no cache:", cold))
        print(_line("cold, empty cache:", fresh_load(paths, cache), cold))
        print(_line("warm cache:", fresh_load(paths, cache), cold))
        files = sorted(paths[0].rglob("*.yml"))
        changed = files[len(files) // 2]
        changed.write_bytes(changed.read_bytes() + b"\n# edited\n")
        print(_line("one file changed:", fresh_load(paths, cache), cold), f"({changed.name})")
        print(_line("warm again:", fresh_load(paths, cache), cold))
    return 0
