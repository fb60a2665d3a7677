"""Dedup for the agent, a process that never ends: state dropped window by window."""

from __future__ import annotations

from pathlib import Path

from hpcsec.detector.alerts.dedup import WindowedDedup
from hpcsec.detector.core.schema import new_event, parse_time
from hpcsec.detector.engine.evaluate import Match
from hpcsec.detector.engine.loader import load_rules

RULE = """title: Test rule cryptominer
id: 7d2b1c1e-0000-4000-8000-00000000000a
status: test
logsource:
  product: hpc
  category: process
detection:
  selection:
    process.name: cryptominer
  condition: selection
level: high
"""


def test_dedup_forgets_ended_windows_but_folds_late_matches(tmp_path: Path):
    (tmp_path / "test.yml").write_text(RULE)
    (loaded,) = load_rules([tmp_path]).rules

    def match(epoch: int) -> Match:
        ts = f"2026-11-30T00:00:{epoch:02d}.000Z"
        return Match(
            loaded,
            (
                new_event(
                    "process",
                    "present",
                    "process",
                    "n1",
                    ts,
                    {"process.name": "cryptominer", "user.name": "u1"},
                ),
            ),
        )

    now = [5.0]
    midnight = parse_time("2026-11-30T00:00:00Z").timestamp()
    dedup = WindowedDedup(10, clock=lambda: midnight + now[0])
    (first,) = dedup.add([match(4)])
    assert dedup.add([match(6)]) == []  # same window: folded
    now[0] = 11.0
    assert dedup.rotate() == []  # nothing forgotten yet: the ended window may get late matches
    assert dedup.add([match(9)]) == []  # late: folded into the ended window's alert
    (second,) = dedup.add([match(11)])
    assert second["alert.id"] != first["alert.id"]
    assert first["count"] == 1  # the alert as it was emitted: folding made new values
    now[0] = 21.0
    (forgotten,) = dedup.rotate()
    assert (forgotten["alert.id"], forgotten["count"]) == (first["alert.id"], 3)
    assert [a["alert.id"] for a in dedup.alerts()] == [second["alert.id"]]
