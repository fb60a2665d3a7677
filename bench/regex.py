"""Worst-case wildcard and `|re` values on 64 KiB command lines, against a plain `contains`.

    python -m bench regex [--repeat N]

Each case is one rule evaluated by the engine on one event whose command line is 64 KiB (the
most the process sensor reads) and shaped to be the pattern's worst input; the baseline is a
`|contains` rule on the same input, measured in the same run. Before the matchers were linear
(issue 12), `*/tmp/*/*/*.so` took more than 120 s on 10,000 characters and `^(\\w+\\s?)*$`
23 s on 29; the ratios printed here stay small multiples of one string scan.
"""

from __future__ import annotations

import argparse
import time

from sigma.collection import SigmaCollection

from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

LIMIT = 64 * 1024
RULE = """title: bench
id: 6f1b2a0e-0000-4000-8000-0000000000bb
logsource: {product: hpc, category: process}
detection:
  sel:
    process.command_line%s: '%s'
  condition: sel
"""
# (name, modifiers, value, worst input)
CASES = [
    ("wildcards */tmp/*/*/*.so", "", "*/tmp/*/*/*.so", "/tmp/" + "/" * (LIMIT - 5)),
    ("wildcards *a?a?a?b*", "", "*a?a?a?b*", "a" * LIMIT),
    # pieces found everywhere, never aligned: one step per character (the linear worst case)
    ("wildcards *a?b*", "", "*a?b*", "ab" * (LIMIT // 2)),
    ("|re ^(\\w+\\s?)*$", "|re", "^(\\w+\\s?)*$", "a" * (LIMIT - 1) + "!"),
    ("|re (a|aa)*b", "|re", "(a|aa)*b", "a" * LIMIT),
    ("|re|i .*x.*y.*z", "|re|i", ".*x.*y.*z", "x" * LIMIT),
]


def engine(modifiers: str, value: str) -> Engine:
    rules = SigmaCollection.from_yaml(RULE % (modifiers, value)).rules
    return Engine(RuleSet([LoadedRule(r, "<bench>", 1, "bench") for r in rules]))


def seconds_per_event(rule_engine: Engine, command_line: str, repeat: int) -> float:
    # a fresh dict per call: the engine must fold the 64 KiB value each time, as in production
    events = [
        {"event.category": "process", "process.command_line": command_line} for _ in range(repeat)
    ]
    start = time.perf_counter()
    for event in events:
        rule_engine.evaluate([event])
    return (time.perf_counter() - start) / repeat


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench regex", description=__doc__)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args(argv)
    print(f"{'case':32} {'per event':>12} {'contains':>12} {'ratio':>7}")
    for name, modifiers, value, text in CASES:
        baseline = seconds_per_event(engine("|contains", "zzz-not-there"), text, args.repeat)
        took = seconds_per_event(engine(modifiers, value), text, args.repeat)
        print(
            f"{name:32} {took * 1e6:10.1f}us {baseline * 1e6:10.1f}us {took / baseline:6.1f}x",
            flush=True,
        )
    return 0
