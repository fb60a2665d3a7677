"""The rule cache keeps one entry per rule file (engine/rulecache.py), in one pack per rule
paths: a load parses only the files that changed, the checks across files run over the
assembled set at every load with the errors a parse gives, and old entries and packs do not
pile up."""

from __future__ import annotations

import errno
import gc
import logging
import multiprocessing
import multiprocessing.resource_tracker
import multiprocessing.spawn
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rule_worker_failures import FailsInWorkers, KillsWorkers, SeenInWorkers, die_holding

from hpcsec.detector.core.errors import RuleError
from hpcsec.detector.engine import coldload, coldpool, rulecache
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import RuleSet

RULE = """title: rule {n}
id: 0c0c0c0c-0000-4000-8000-{n:012d}
{name}logsource: {{product: hpc, category: process}}
detection:
  sel:
    process.name: {value}
  condition: sel
"""

CORRELATION = """title: repeated
id: 0c0c0c0c-0000-4000-8000-00000000c0c0
correlation:
  type: event_count
  rules:
    - {ref}
  group-by: [host.name]
  timespan: 5m
  condition: {{gte: 2}}
"""


def write(path: Path, n: int, value: str = "nc", name: str | None = None) -> Path:
    path.write_text(RULE.format(n=n, value=value, name=f"name: {name}\n" if name else ""))
    return path


def rule_files(tmp_path: Path, count: int) -> None:
    for n in range(count):
        write(tmp_path / f"r{n}.yml", n, value=f"tool{n}")


def in_workers(
    tmp_path: Path, monkeypatch, count: int, workers: int = 1, group: int | None = None
) -> RuleSet:
    """`count` rule files, loaded by `workers` worker processes from now on (in groups of
    `group` files); their load by one process, to compare with."""
    rule_files(tmp_path, count)
    serial = load_rules([tmp_path], with_tests=False)
    monkeypatch.setattr(coldpool, "workers_for", lambda files: workers)
    if group is not None:
        monkeypatch.setattr(coldload, "GROUP_FILES", group)
    return serial


def entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))


def stored(cache: Path, roots: list[Path]) -> set[str]:
    """The keys of the entries the pack of `roots` holds."""
    return set(rulecache.read(cache, roots))


def key_of(path: Path, thresholds: dict[str, int] | None = None) -> str:
    return rulecache.file_key(rulecache.fingerprint() or b"", path, path.read_bytes(), thresholds)


@pytest.fixture
def parsed(monkeypatch) -> list[str]:
    """The files load_file parses in this process (the real one runs; a spawned worker
    process has the real one only)."""
    seen: list[str] = []
    real = coldload.load_file

    def spy(path, ruleset, threshold_values=None, origin="", data=None):
        seen.append(path.name)
        return real(path, ruleset, threshold_values, origin, data)

    monkeypatch.setattr(coldload, "load_file", spy)
    return seen


def wait_for(marker: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def errors_of(ruleset) -> list[str]:
    return [str(e) for e in ruleset.errors]


def summary(ruleset) -> list[tuple[str, str, int, str]]:
    return [(r.id, r.path, r.line, r.origin) for r in ruleset.rules]


def test_only_the_changed_file_is_parsed_and_the_set_is_the_parsed_one(tmp_path, parsed):
    files = [write(tmp_path / f"r{n}.yml", n) for n in range(4)]
    cache = tmp_path / "hpcsec"
    load_rules([tmp_path], with_tests=False, cache=cache)
    assert sorted(parsed) == ["r0.yml", "r1.yml", "r2.yml", "r3.yml"]
    assert entries(cache) == [rulecache.pack_name([tmp_path])]
    assert stored(cache, [tmp_path]) == {key_of(f) for f in files}
    parsed.clear()
    write(files[2], 2, value="ncat")
    loaded = load_rules([tmp_path], with_tests=False, cache=cache)
    assert parsed == ["r2.yml"]
    cold = load_rules([tmp_path], with_tests=False)
    assert summary(loaded) == summary(cold) and loaded.files == cold.files
    assert loaded.rules == cold.rules  # pySigma objects alike
    events = [{"event.category": "process", "process.name": v} for v in ("nc", "ncat")]
    found = sorted(
        (m.rule.id, m.events[0]["process.name"]) for m in Engine(loaded).evaluate(events)
    )
    assert found == sorted(
        (m.rule.id, m.events[0]["process.name"]) for m in Engine(cold).evaluate(events)
    )
    parsed.clear()
    load_rules([tmp_path], with_tests=False, cache=cache, threshold_values={"x": 1})
    assert len(parsed) == 4  # thresholds are part of every file's key


def test_duplicates_across_files_are_found_at_every_load_with_the_parse_errors(tmp_path, parsed):
    write(tmp_path / "a.yml", 1, name="shared")
    write(tmp_path / "b.yml", 1)  # the id of a.yml's rule
    write(tmp_path / "c.yml", 3, name="shared")  # the name of a.yml's rule
    (tmp_path / "d.yml").write_text("title: broken\nlogsource: {category: process}\ndetection: 5\n")
    cache = tmp_path / "hpcsec"
    cold = load_rules([tmp_path], with_tests=False, collect_errors=True)
    first = load_rules([tmp_path], with_tests=False, collect_errors=True, cache=cache)
    parsed.clear()
    again = load_rules([tmp_path], with_tests=False, collect_errors=True, cache=cache)
    assert parsed == []  # every file from its entry, d.yml's errors too
    expected = errors_of(cold)
    assert any(f"{tmp_path / 'b.yml'}:2: duplicate rule id" in e for e in expected)
    assert any(f"{tmp_path / 'c.yml'}:3: duplicate rule name shared" in e for e in expected)
    assert any(str(tmp_path / "d.yml") in e for e in expected)
    assert errors_of(first) == errors_of(again) == expected
    assert summary(first) == summary(again) == summary(cold)
    with pytest.raises(RuleError) as raised:
        load_rules([tmp_path], with_tests=False, cache=cache)
    assert str(raised.value) == expected[0]  # the first error, as a parse gives it


def test_a_correlation_whose_rule_went_away_in_another_file_fails_from_its_entry(tmp_path, parsed):
    write(tmp_path / "base.yml", 1)
    corr = tmp_path / "corr.yml"
    corr.write_text(CORRELATION.format(ref="0c0c0c0c-0000-4000-8000-000000000001"))
    cache = tmp_path / "hpcsec"
    loaded = load_rules([tmp_path], with_tests=False, cache=cache)
    assert [r.kind for r in loaded.rules] == ["detection", "correlation"]
    write(tmp_path / "base.yml", 2)  # the referenced rule is gone; corr.yml is unchanged
    parsed.clear()
    loaded = load_rules([tmp_path], with_tests=False, collect_errors=True, cache=cache)
    assert parsed == ["base.yml"]
    cold = load_rules([tmp_path], with_tests=False, collect_errors=True)
    assert (
        errors_of(loaded)
        == errors_of(cold)
        == [f"{corr}:6: correlation names unknown rule '0c0c0c0c-0000-4000-8000-000000000001'"]
    )
    assert summary(loaded) == summary(cold)
    corr.write_text(CORRELATION.format(ref="0C0C0C0C-0000-4000-8000-000000000002"))  # by UUID
    assert [r.kind for r in load_rules([tmp_path], with_tests=False, cache=cache).rules] == [
        "detection",
        "correlation",
    ]


def test_a_pack_keeps_the_latest_spare_entries_and_the_current_ones(tmp_path, monkeypatch, parsed):
    monkeypatch.setattr(rulecache, "SPARE_ENTRIES", 2)
    rules = tmp_path / "rules"
    rules.mkdir()
    steady = write(rules / "steady.yml", 1)
    edited = rules / "edited.yml"
    cache = tmp_path / "hpcsec"
    keys = []
    for n in range(6):
        write(edited, 2, value=f"tool{n}")
        keys.append(key_of(edited))
        load_rules([rules], with_tests=False, cache=cache)
        assert stored(cache, [rules]) == {key_of(steady), *keys[-3:]}  # current + 2 latest
    pack = cache / rulecache.pack_name([rules])
    written = pack.stat().st_ino
    parsed.clear()
    write(edited, 2, value="tool4")  # an edit undone: its entry is still there
    load_rules([rules], with_tests=False, cache=cache)
    assert parsed == []
    assert pack.stat().st_ino == written  # 2 entries of no file: within the spares, unwritten
    steady_key = key_of(steady)
    steady.unlink()  # one more: the pack is written again with the 2 latest
    load_rules([rules], with_tests=False, cache=cache)
    assert pack.stat().st_ino != written
    assert stored(cache, [rules]) == {keys[4], keys[5], steady_key}


def test_packs_beyond_the_bound_and_old_entry_files_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(rulecache, "MAX_PACKS", 3)
    cache = tmp_path / "hpcsec"
    cache.mkdir(mode=0o700)
    (cache / "config-entry").write_bytes(b"another cache's")  # not the rule cache's to remove
    (cache / f"{rulecache.OLD_ENTRY_PREFIX}{'0' * 64}").write_bytes(b"an earlier version's")
    files = [write(tmp_path / f"r{n}.yml", n) for n in range(6)]
    load_rules([files[0]], with_tests=False, cache=cache)
    assert entries(cache) == ["config-entry", rulecache.pack_name(files[:1])]
    for n, file in enumerate(files[1:], 1):
        time.sleep(0.01)  # mtimes apart
        load_rules([file], with_tests=False, cache=cache)
        if n == 3:
            time.sleep(0.01)
            load_rules([files[1]], with_tests=False, cache=cache)  # read: used again
    assert entries(cache) == sorted(
        ["config-entry", *(rulecache.pack_name([files[n]]) for n in (1, 4, 5))]
    )


def test_one_pack_serves_the_paths_in_any_order_and_spelling(tmp_path, parsed):
    one, two = tmp_path / "one", tmp_path / "two"
    for n, directory in enumerate((one, two)):
        directory.mkdir()
        write(directory / "r.yml", n)
    cache = tmp_path / "hpcsec"
    load_rules([one, two], with_tests=False, cache=cache)
    parsed.clear()
    load_rules([two, f"{one}/", one], with_tests=False, cache=cache)
    assert parsed == []
    assert entries(cache) == [rulecache.pack_name([one, two])]
    load_rules([one], with_tests=False, cache=cache)  # other paths: a pack of their own
    assert len(entries(cache)) == 2


def test_many_files_parse_in_workers_with_the_serial_rules_and_errors(
    tmp_path, monkeypatch, parsed
):
    rule_files(tmp_path, 9)
    (tmp_path / "r3.yml").write_text("title: [unclosed\n")
    (tmp_path / "r6.yml").write_text(
        RULE.format(n=6, value="x", name="").replace("sel\n", "nope\n")
    )
    write(tmp_path / "r7.yml", 1)  # a duplicate id
    serial = load_rules([tmp_path], with_tests=False, collect_errors=True)
    monkeypatch.setattr(coldpool, "PARALLEL_MIN_FILES", 2)
    monkeypatch.setattr(coldload, "GROUP_FILES", 2)
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    marker = tmp_path / "worker-parsing"
    spy = coldload.load_file

    def after_a_worker_began(*args, **kwargs):
        spy(*args, **kwargs)
        wait_for(marker)  # the caller's first group waits until the worker parses one

    monkeypatch.setattr(coldload, "load_file", after_a_worker_began)
    parsed.clear()
    encoded: list[int] = []
    real_encode = rulecache.encode
    monkeypatch.setattr(rulecache, "encode", lambda *a: encoded.append(1) or real_encode(*a))
    parallel = load_rules(
        [tmp_path], with_tests=False, collect_errors=True, threshold_values=SeenInWorkers(marker)
    )
    monkeypatch.setattr(rulecache, "encode", real_encode)
    assert marker.exists()
    assert 0 < len(parsed) <= 7  # the caller parsed groups from the end, a worker the others
    assert parsed[0] == "r8.yml"  # the last group (of one file) is the caller's first
    assert errors_of(parallel) == errors_of(serial) and len(serial.errors) == 3
    assert summary(parallel) == summary(serial) and parallel.rules == serial.rules
    assert all(r.sigma_loaded for r in parallel.rules)  # parsed rules keep their objects
    assert encoded == []  # the caller's share became rules without a pickle round trip
    cached = load_rules([tmp_path], with_tests=False, collect_errors=True, cache=tmp_path / "c")
    assert errors_of(cached) == errors_of(serial) and summary(cached) == summary(serial)


def test_workers_that_die_leave_their_files_to_the_caller(tmp_path, monkeypatch):
    serial = in_workers(tmp_path, monkeypatch, 6, group=1)
    python = multiprocessing.spawn.get_executable()
    # the resource tracker started first, by the real interpreter: only the workers fail
    multiprocessing.resource_tracker.ensure_running()
    multiprocessing.spawn.set_executable("/bin/false")  # worker interpreters that exit at once
    try:
        loaded = load_rules([tmp_path], with_tests=False)
    finally:
        multiprocessing.spawn.set_executable(python)
    assert summary(loaded) == summary(serial) and loaded.rules == serial.rules


@pytest.mark.parametrize("cached", [False, True])
def test_groups_of_a_worker_killed_while_parsing_them_are_parsed_by_the_caller(
    tmp_path, monkeypatch, cached
):
    serial = in_workers(tmp_path, monkeypatch, 6, group=2)
    marker = tmp_path / "worker-killed"
    real = coldload.load_file

    def after_the_worker_died(*args, **kwargs):
        wait_for(marker)  # the worker has claimed the first group and died in it
        return real(*args, **kwargs)

    monkeypatch.setattr(coldload, "load_file", after_the_worker_died)
    loaded = load_rules(
        [tmp_path],
        with_tests=False,
        threshold_values=KillsWorkers(marker),
        cache=tmp_path / "c" if cached else None,
    )
    assert marker.exists()
    assert summary(loaded) == summary(serial) and loaded.rules == serial.rules


def test_the_caller_takes_in_a_workers_entries_between_its_own_files(tmp_path, monkeypatch):
    """What a worker parsed is taken in (unpickled) while files are left, as part of the
    caller's share, not all after the last one (which would leave the worker idle)."""
    serial = in_workers(tmp_path, monkeypatch, 8, group=1)
    marker = tmp_path / "worker-parsing"
    steps: list[str] = []
    real_here, real_received = coldload._parsed_part, coldload._received_part

    def here(path, threshold_values):
        if not steps:
            wait_for(marker)
            time.sleep(1.0)  # the worker, at 0.2 s a file, has sent a few meanwhile
        steps.append("here")
        return real_here(path, threshold_values)

    def received(path, entry, threshold_values):
        steps.append("received")
        return real_received(path, entry, threshold_values)

    monkeypatch.setattr(coldload, "_parsed_part", here)
    monkeypatch.setattr(coldload, "_received_part", received)
    loaded = load_rules(
        [tmp_path], with_tests=False, threshold_values=SeenInWorkers(marker, seconds=0.2)
    )
    assert summary(loaded) == summary(serial) and loaded.rules == serial.rules
    assert steps.count("here") >= 2 and "received" in steps
    assert steps.index("received") < len(steps) - 1 - steps[::-1].index("here")


def test_a_lock_left_held_by_a_killed_process_does_not_hang_the_load(tmp_path, monkeypatch):
    serial = in_workers(tmp_path, monkeypatch, 6)
    monkeypatch.setattr(coldpool, "CLAIM_TIMEOUT_S", 0.5)
    monkeypatch.setattr(coldload, "GROUP_FILES", 1)
    real_start = coldpool.start_workers

    def start(files: int) -> coldpool.Workers | None:
        workers = real_start(files)
        assert workers is not None
        real_send = workers.send

        def send(*args):
            taken = real_send(*args)
            # after the claims were set: a process dies holding their lock
            context = multiprocessing.get_context("spawn")
            holder = context.Process(target=die_holding, args=(workers.claims,))
            holder.start()
            holder.join(60)
            assert holder.exitcode == -signal.SIGKILL
            return taken

        monkeypatch.setattr(workers, "send", send)
        return workers

    monkeypatch.setattr(coldpool, "start_workers", start)
    done: list[Any] = []
    loading = threading.Thread(
        target=lambda: done.append(load_rules([tmp_path], with_tests=False)), daemon=True
    )
    loading.start()
    loading.join(60)
    assert done, "the load hangs on a lock its holder died with"
    assert summary(done[0]) == summary(serial) and done[0].rules == serial.rules


def test_a_failing_caller_stops_its_workers_after_their_group(tmp_path, monkeypatch):
    rule_files(tmp_path, 20)
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    monkeypatch.setattr(coldload, "GROUP_FILES", 1)
    started: list[coldpool.Workers | None] = []
    real_start = coldpool.start_workers
    monkeypatch.setattr(
        coldpool, "start_workers", lambda n: started.append(real_start(n)) or started[-1]
    )
    marker = tmp_path / "worker-reads"

    def interrupted(*args, **kwargs):
        wait_for(marker)  # the worker is parsing (a file every 0.2 s)
        raise KeyboardInterrupt

    monkeypatch.setattr(coldload, "load_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_rules([tmp_path], with_tests=False, threshold_values=SeenInWorkers(marker, 0.2))
    (workers,) = started
    assert workers is not None
    for process in workers.processes:
        process.join(60)
        assert process.exitcode in (0, -signal.SIGTERM)  # ended, or stopped before its task
    # the group it was parsing, perhaps the next: not the 19 left
    assert len(marker.read_text().splitlines()) <= 3


def test_claims_wait_for_a_lock_left_held_once_then_claim_nothing():
    class NeverFree:
        calls = 0

        def acquire(self, timeout: float | None = None) -> bool:
            self.calls += 1
            return False

        def release(self) -> None:
            raise AssertionError("released a lock it never held")

    class Shared:
        lock = NeverFree()

        def get_lock(self) -> NeverFree:
            return self.lock

    claims = coldpool.Claims(Shared(), 0.01)
    assert claims.end() is None and claims.front() is None
    assert not claims.reset(3)
    claims.close()
    assert Shared.lock.calls == 1  # one timeout, not one per call (stop() would wait again)


def test_two_workers_one_dead_before_its_task_the_other_parses(tmp_path, monkeypatch):
    serial = in_workers(tmp_path, monkeypatch, 12, workers=2, group=1)
    real_start = coldpool.start_workers
    received: list[str] = []
    real_received = coldload._received_part

    def start(files: int) -> coldpool.Workers | None:
        workers = real_start(files)
        assert workers is not None and len(workers.processes) == 2
        real_send = workers.send

        def send(*args):
            workers.processes[0].kill()  # the first dies before its task is sent
            workers.processes[0].join(60)
            return real_send(*args)

        monkeypatch.setattr(workers, "send", send)
        return workers

    real_here = coldload._parsed_part

    def slow_here(path, threshold_values):
        time.sleep(0.3)  # the live worker has time to send some
        return real_here(path, threshold_values)

    monkeypatch.setattr(coldpool, "start_workers", start)
    monkeypatch.setattr(coldload, "_parsed_part", slow_here)
    monkeypatch.setattr(
        coldload,
        "_received_part",
        lambda path, entry, thresholds: (
            received.append(path.name) or real_received(path, entry, thresholds)
        ),
    )
    loaded = load_rules([tmp_path], with_tests=False)
    assert summary(loaded) == summary(serial) and loaded.rules == serial.rules
    assert received  # the second worker was sent the task and parsed


def test_a_default_socket_timeout_leaves_the_workers_connection_blocking(tmp_path, monkeypatch):
    rule_files(tmp_path, 4)
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    real_send_to = coldpool.Workers._send_to
    blocking: list[bool] = []

    def send_to(self, connection, task):
        real_send_to(self, connection, task)
        blocking.append(os.get_blocking(connection.fileno()))

    monkeypatch.setattr(coldpool.Workers, "_send_to", send_to)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)
    try:
        load_rules([tmp_path], with_tests=False)
    finally:
        socket.setdefaulttimeout(previous)
    assert blocking == [True]


def test_workers_stopped_before_their_task_end_without_a_traceback(monkeypatch, capfd):
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    workers = coldpool.start_workers(5000)
    assert workers is not None
    processes = list(workers.processes)
    workers.stop()
    del workers
    gc.collect()  # the claims' lock goes: a worker still starting could not read it
    for process in processes:
        process.join(60)
        assert process.exitcode is not None
    assert "Traceback" not in capfd.readouterr().err


def test_no_temporary_file_for_the_workers_is_said_and_the_caller_parses_alone(
    tmp_path, monkeypatch, caplog
):
    serial = in_workers(tmp_path, monkeypatch, 4)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(coldpool.tempfile, "TemporaryFile", full)
    with caplog.at_level(logging.WARNING):
        loaded = load_rules([tmp_path], with_tests=False)
    assert summary(loaded) == summary(serial) and loaded.rules == serial.rules
    assert "No space left on device): parsing 4 files in one process" in caplog.text


def test_an_empty_cache_starts_the_workers_before_reading_the_files(tmp_path, monkeypatch):
    rule_files(tmp_path, 4)
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    steps: list[str] = []
    real_start, real_read = coldpool.start_workers, rulecache.read_file
    monkeypatch.setattr(coldpool, "start_workers", lambda n: steps.append("start") or real_start(n))
    monkeypatch.setattr(rulecache, "read_file", lambda p: steps.append("read") or real_read(p))
    cache = tmp_path / "c"
    first = load_rules([tmp_path], with_tests=False, cache=cache)
    assert steps == ["start"] + ["read"] * 4
    steps.clear()
    write(tmp_path / "r0.yml", 0, value="changed")
    again = load_rules([tmp_path], with_tests=False, cache=cache)
    assert steps == ["read"] * 4 + ["start"]  # a pack to read: workers only for a miss
    assert len(again.rules) == len(first.rules) == 4


def test_an_entry_holds_the_bytes_its_key_was_made_of_when_the_file_changes_meanwhile(
    tmp_path, monkeypatch
):
    rule = write(tmp_path / "r.yml", 1, value="before")
    real = rulecache.read_file

    def read_then_edited(path):
        data = real(path)
        write(rule, 1, value="after")  # an edit lands between the read and the parse
        return data

    monkeypatch.setattr(rulecache, "read_file", read_then_edited)
    cache = tmp_path / "hpcsec"
    first = load_rules([rule], with_tests=False, cache=cache)
    monkeypatch.setattr(rulecache, "read_file", real)
    values = [
        str(r.sigma.detection.detections["sel"].detection_items[0].value[0]) for r in first.rules
    ]
    assert values == ["before"]  # what was keyed is what was parsed
    again = load_rules([rule], with_tests=False, cache=cache)
    assert [
        str(r.sigma.detection.detections["sel"].detection_items[0].value[0]) for r in again.rules
    ] == ["after"]


def test_the_garbage_collector_is_paused_while_files_parse_and_restored_after(
    tmp_path, monkeypatch
):
    """Every parsed rule stays alive during a load: a collection walks them all again."""
    rule_files(tmp_path, 3)
    enabled_while_parsing: list[bool] = []
    real = coldload.load_file

    def spy(path, ruleset, threshold_values=None, origin="", data=None):
        enabled_while_parsing.append(gc.isenabled())
        return real(path, ruleset, threshold_values, origin, data)

    monkeypatch.setattr(coldload, "load_file", spy)
    assert gc.isenabled()
    load_rules([tmp_path], with_tests=False)
    load_rules([tmp_path], with_tests=False, cache=tmp_path / "cache")
    assert enabled_while_parsing == [False] * 6 and gc.isenabled()
    gc.disable()  # a caller that runs without it keeps it off
    try:
        load_rules([tmp_path], with_tests=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_cold_load_compiles_nothing(tmp_path):
    """Each category's match function is built at its first event (Engine(lazy=True)), not
    while the rules load: a fresh interpreter loads rules without importing the compiler."""
    rule_files(tmp_path, 3)
    code = (
        "import sys; from hpcsec.detector.engine.loader import load_rules; "
        f"rules = load_rules([{str(tmp_path)!r}], with_tests=False); "
        "print(len(rules.rules), 'hpcsec.detector.engine.compile' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "False"]


def test_a_warm_load_imports_no_worker_pool(tmp_path):
    """The worker processes of a parse cost imports a load from the cache does not pay."""
    rule_files(tmp_path, 3)
    code = (
        "import sys; from pathlib import Path; "
        "from hpcsec.detector.engine.loader import load_rules; "
        f"rules = load_rules([{str(tmp_path)!r}], with_tests=False, "
        f"cache=Path({str(tmp_path / 'cache')!r})); "
        "print(len(rules.rules), "
        "any(m in sys.modules for m in ('hpcsec.detector.engine.coldpool', "
        "'concurrent.futures.process')))"
    )
    for expected in (["3", "True"], ["3", "False"]):  # cold (parsed), then warm
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == expected


def test_groups_whose_worker_raises_are_parsed_by_the_caller(tmp_path, monkeypatch):
    rules = tmp_path / "rules"
    rules.mkdir()
    for n in range(8):
        write(rules / f"r{n}.yml", n, value=f"tool{n}")
    # an error found after the thresholds are read (a YAML error is found before: a worker
    # would send it back without raising, and the caller would not parse that file)
    (rules / "r5.yml").write_text(RULE.format(n=5, name="", value="x").replace("sel\n", "nosel\n"))
    serial = load_rules([rules], with_tests=False, collect_errors=True)
    assert [e for e in errors_of(serial) if "r5.yml" in e]
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    monkeypatch.setattr(coldload, "GROUP_FILES", 1)
    real = coldload.load_file
    parsed: list[str] = []
    for cache in (None, tmp_path / "cache"):
        marker = tmp_path / f"worker-raised-{cache is None}"
        parsed.clear()

        def spy(path, ruleset, threshold_values=None, origin="", data=None, *, marker=marker):
            wait_for(marker)  # until a worker has failed on a group
            parsed.append(path.name)
            return real(path, ruleset, threshold_values, origin, data)

        monkeypatch.setattr(coldload, "load_file", spy)
        loaded = load_rules(
            [rules],
            with_tests=False,
            collect_errors=True,
            threshold_values=FailsInWorkers(marker),
            cache=cache,
        )
        assert marker.exists()
        assert sorted(parsed) == sorted(f"r{n}.yml" for n in range(8))  # all of them, here
        assert summary(loaded) == summary(serial) and errors_of(loaded) == errors_of(serial)


def test_workers_are_stopped_when_the_parser_cannot_be_imported(monkeypatch) -> None:
    """Started before the parser's import: if that import fails, nothing else would stop them."""
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    workers = coldpool.start_workers(5000)
    assert workers is not None
    with pytest.raises(ImportError), coldpool.stopped_on_error(workers):
        raise ImportError("the parser is broken")
    assert_stopped(workers)
    with coldpool.stopped_on_error(None):  # no workers: nothing to stop, the block runs
        pass


def assert_stopped(workers: coldpool.Workers) -> None:
    """No group left to claim, and each worker process ends (it waited for a task)."""
    assert workers.claims.front() is None and workers.claims.end() is None
    for process in workers.processes:
        process.join(60)
        assert process.exitcode in (0, -signal.SIGTERM)  # ended, or stopped before its task


@pytest.mark.parametrize("cached", [False, True])
def test_a_load_whose_parser_cannot_be_imported_stops_its_workers(
    tmp_path, monkeypatch, cached
) -> None:
    for n in range(3):
        write(tmp_path / f"r{n}.yml", n)
    started: list[coldpool.Workers | None] = []
    real_start = coldpool.start_workers
    monkeypatch.setattr(coldpool, "workers_for", lambda files: 1)
    monkeypatch.setattr(
        coldpool, "start_workers", lambda n: started.append(real_start(n)) or started[-1]
    )
    monkeypatch.setitem(sys.modules, "hpcsec.detector.engine.coldload", None)  # import fails
    cache = tmp_path / "c" if cached else None
    with pytest.raises(ImportError):
        load_rules([tmp_path], with_tests=False, collect_errors=True, cache=cache)
    assert len(started) == 1 and started[0] is not None
    assert_stopped(started[0])


@pytest.mark.parametrize("cached", [False, True])
def test_a_load_stops_its_workers_without_waiting_for_their_exit(tmp_path, monkeypatch, cached):
    """With every result in, a worker's exit (its interpreter's teardown) is no work of the
    load's: the caller goes on while the worker ends."""
    serial = in_workers(tmp_path, monkeypatch, 4, group=1)
    joins: list[float | None] = []
    started: list[coldpool.Workers | None] = []
    real_start = coldpool.start_workers

    def start(files: int) -> coldpool.Workers | None:
        workers = real_start(files)
        assert workers is not None
        for process in workers.processes:
            real_join = process.join

            def join(timeout: float | None = None, real_join=real_join) -> None:
                joins.append(timeout)
                real_join(timeout)

            monkeypatch.setattr(process, "join", join)
        started.append(workers)
        return workers

    monkeypatch.setattr(coldpool, "start_workers", start)
    cache = tmp_path / "c" if cached else None
    loaded = load_rules([tmp_path], with_tests=False, cache=cache)
    assert summary(loaded) == summary(serial)
    assert len(started) == 1 and joins == [0]  # reaped if it has ended, never waited for
    assert_stopped(started[0])  # stopped all the same
