"""`scan --events --jobs 2` with the detection rules run in the worker processes
(runtime/chunk_detect.py): the caller evaluates only what they send back, and the alerts,
the summary, the malformed-line report and the store must be exactly those of `--jobs 1`."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import orjson
import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.eventio import InputReport, read_jsonl
from hpcsec.detector.core.schema import Event
from hpcsec.detector.engine import flush_parts, flush_steps, part_task
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules
from hpcsec.detector.engine.ruleset import RuleSet
from hpcsec.detector.runtime import chunk_detect, chunked
from hpcsec.detector.runtime.pipeline import Pipeline
from tests.detector.test_scan_parallel import MALFORMED, write_events

GPU_RULE = """\
title: A GPU two users share
id: 6a0b3b7e-1c4d-4f4e-9a51-5b0f1c2d3e4f
status: test
description: fires on the gpu_users enrichment, which relates the events of a batch
logsource: {product: hpc, category: gpu_device}
detection:
  selection:
    gpu.process_user_count: 2
  condition: selection
level: low
"""


@pytest.fixture
def evaluated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many events the caller's engine evaluated, per call."""
    counts: list[int] = []
    real = Pipeline.evaluate

    def counting(self: Pipeline, events: list[Event]) -> list:
        counts.append(len(events))
        return real(self, events)

    monkeypatch.setattr(Pipeline, "evaluate", counting)
    return counts


def scan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["scan", "--format", "jsonl", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def write_sequences(path: Path, rounds: int) -> None:
    """The bundled rules' matching test events, then every correlation test sequence of
    theirs (firing or not), a round two days after the one before, with malformed lines and
    filler events no rule matches in between."""
    write_events(path, rounds=2)
    ruleset = load_rules([str(bundled_rules_dir())], with_tests=True)
    sequences = [s for test in ruleset.tests for s in test.sequences]
    lines = []
    for r in range(rounds):
        for n, sequence in enumerate(sequences):
            for i, event in enumerate(sequence.events):
                when = datetime.fromisoformat(str(event["@timestamp"])) + timedelta(days=2 * r)
                at = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                lines.append(json.dumps({**event, "@timestamp": at, "event.id": f"{r}-{n}-{i}"}))
                lines += [json.dumps({"event.category": "process", "process.name": "ls"})] * (i % 3)
            if n % 5 == 2:
                lines.append(MALFORMED[(r + n) % len(MALFORMED)])
    with path.open("a") as out:
        out.write("\n" + "\n".join(lines) + "\n")


def test_workers_detect_and_the_caller_gives_the_same_output(
    tmp_path, capsys, small_chunks, evaluated, monkeypatch
):
    events = tmp_path / "events.jsonl"
    write_sequences(events, rounds=4)
    assert events.stat().st_size > 20 * 4096
    serial = scan(capsys, "--events", str(events), "--jobs", "1")
    total = sum(evaluated)
    evaluated.clear()
    detected_by = set()  # bytes: a worker's JSON; list: done in the caller while it waited
    real_kept_of = chunk_detect.kept_of

    def kept_of(chunk: chunk_detect.DetectedChunk | chunked.ParsedChunk) -> tuple:
        if isinstance(chunk, chunk_detect.DetectedChunk):
            detected_by.add(type(chunk.kept))
        return real_kept_of(chunk)

    monkeypatch.setattr(chunk_detect, "kept_of", kept_of)
    parallel = scan(capsys, "--events", str(events), "--jobs", "2")
    assert parallel == serial
    assert small_chunks == []  # no worker failed
    assert detected_by == {bytes, list}  # the worker starts while the caller detects
    alerts = [json.loads(line) for line in serial[1].splitlines()]
    kinds = {a["rule.kind"] for a in alerts}
    assert kinds == {"detection", "correlation"}
    assert len({a["rule.id"] for a in alerts if a["rule.kind"] == "correlation"}) >= 8
    assert "malformed line(s) of" in serial[2]
    assert f"hpcsec: {total} events evaluated" in serial[2]
    assert sum(evaluated) < total  # the caller evaluated only what the workers kept


@pytest.fixture
def worker_parts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The alerts each worker's part of the correlation pass at the end sent back, counted
    (engine/flush_parts.py; `split_always` splits every pass)."""
    received: list[int] = []
    real_received = flush_parts.received

    def counted(engine: Engine, part: flush_steps.Part, result: part_task.PartResult) -> list:
        received.append(len(result.fired))
        return real_received(engine, part, result)

    monkeypatch.setattr(flush_parts, "received", counted)
    return received


def split_always(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flush_parts, "SPLIT_MIN_FEEDS", 0)


@pytest.mark.parametrize("jobs", [2, 3])
def test_the_correlation_pass_at_the_end_is_shared_with_the_workers(
    tmp_path, capsys, small_chunks, monkeypatch, worker_parts, jobs
):
    """The held matches' pass at the end of the input, split by chain between the caller and
    its workers (engine/flush_parts.py): the output is still that of `--jobs 1`, and each
    worker did a part (its alerts came back)."""
    events = tmp_path / "events.jsonl"
    write_sequences(events, rounds=4)
    serial = scan(capsys, "--events", str(events), "--jobs", "1")
    split_always(monkeypatch)
    assert scan(capsys, "--events", str(events), "--jobs", str(jobs)) == serial
    assert len(worker_parts) == jobs - 1 and all(worker_parts)
    assert small_chunks == []


def gpu_events(rounds: int) -> list[dict]:
    """gpu_process and gpu_device events of four GPUs, one to three users on each, with
    filler events between them, so that the batches of 256 events that relate them begin
    and end in every place of the 4 KiB chunks."""
    out: list[dict] = []
    for r in range(rounds):
        for gpu in range(4):
            for user in range(1 + (r + gpu) % 3):
                out.append(
                    {
                        "@timestamp": f"2026-11-01T{r % 24:02d}:00:00.000Z",
                        "event.category": "gpu_process",
                        "host.name": f"gpu{r % 5:03d}",
                        "gpu.uuid": f"GPU-{gpu}",
                        "user.name": f"u{user}",
                        "process.pid": 100 + user,
                    }
                )
            out.append(
                {
                    "@timestamp": f"2026-11-01T{r % 24:02d}:00:01.000Z",
                    "event.category": "gpu_device",
                    "host.name": f"gpu{r % 5:03d}",
                    "gpu.uuid": f"GPU-{gpu}",
                    "gpu.index": gpu,
                }
            )
        out += [{"event.category": "process", "process.name": f"p{r}-{i}"} for i in range(r % 7)]
    return out


def test_gpu_users_relate_events_across_chunks_as_in_one_process(tmp_path, capsys, small_chunks):
    """gpu_users relates the gpu_device and gpu_process events of one batch: the caller does
    it for the workers, so a batch cut by a chunk's end is enriched as a whole."""
    rules = tmp_path / "shared_gpu.yml"
    rules.write_text(GPU_RULE)
    events = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for e in gpu_events(rounds=60)]
    lines[7:7] = ["not json", ""]  # the batches' places move by the lines skipped
    events.write_text("\n".join(lines) + "\n")
    assert events.stat().st_size > 10 * 4096
    argv = ("--events", str(events), "--rules", str(rules), "--no-dedup")
    serial = scan(capsys, *argv, "--jobs", "1")
    parallel = scan(capsys, *argv, "--jobs", "2")
    assert parallel == serial
    assert small_chunks == []
    fired = [json.loads(line) for line in serial[1].splitlines()]
    shared = [a for a in fired if a["rule.id"] == "6a0b3b7e-1c4d-4f4e-9a51-5b0f1c2d3e4f"]
    assert len(shared) > 10


def test_a_killed_worker_gives_the_same_output(tmp_path, capsys, small_chunks, monkeypatch):
    """The chunks of a worker that died are parsed and evaluated in the caller."""
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=6)
    serial = scan(capsys, "--events", str(events), "--jobs", "1")
    real_merge = chunked.merge
    merged = []

    def kill_workers_after_two_chunks(*args: object) -> None:
        merged.append(args[1])
        if len(merged) == 2:
            for child in multiprocessing.active_children():
                if child.pid is not None:
                    # already reaped by the pool since active_children(): it is dead anyway
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGKILL)
        real_merge(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(chunked, "merge", kill_workers_after_two_chunks)
    assert scan(capsys, "--events", str(events), "--jobs", "2") == serial
    assert small_chunks  # the chunks after the kill were parsed here
    assert any(isinstance(c, chunk_detect.DetectedChunk) for c in merged)


def fails_on_the_first_chunk(
    path: str, start: int, end: int, prepare: chunked.Prepare | None
) -> chunked.ParsedChunk:
    """A worker's task that meets a bug on the file's first chunk."""
    if start == 0:
        raise ValueError("a bug no test foresaw")
    return chunked.parse_chunk(path, start, end, prepare)


def test_a_chunk_whose_worker_raised_is_parsed_in_the_caller(tmp_path, small_chunks):
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=2)
    with events.open("rb") as stream:
        one = InputReport(str(events))
        expected = list(read_jsonl(stream, one))
        stream.seek(0)
        two = InputReport(str(events))
        chunks = chunked.in_file_order(str(events), stream, two, 1, fails_on_the_first_chunk, None)
        read = [
            e
            for c in chunks
            for a in c.arrays
            for e in (orjson.loads(a) if isinstance(a, bytes) else a)
        ]
    assert read == expected and two == one
    assert [start for start, _ in small_chunks] == [0]


def stored(path: Path) -> tuple[list, list]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        events = con.execute("SELECT * FROM events ORDER BY event_id").fetchall()
        alerts = con.execute(
            "SELECT * EXCLUDE (stored_at) FROM alerts ORDER BY alert_id"
        ).fetchall()
    finally:
        con.close()
    return events, alerts


def test_with_a_store_every_event_is_stored_as_in_one_process(tmp_path, capsys, small_chunks):
    """The store keeps every event: the workers then only parse, the caller evaluates."""
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=3)
    runs = []
    for jobs in ("1", "2"):
        store = tmp_path / f"store{jobs}.duckdb"
        runs.append(scan(capsys, "--events", str(events), "--jobs", jobs, "--store", str(store)))
    assert runs[1] == runs[0]
    one, two = stored(tmp_path / "store1.duckdb"), stored(tmp_path / "store2.duckdb")
    assert len(one[0]) > 100 and one[1]
    assert two == one


def test_batches_are_cut_as_in_one_process_wherever_the_chunks_end():
    """batches_of: each batch holds the kept events of `size` consecutive events of the
    file, whatever the chunks' sizes; the context events stay apart."""
    events = [{"n": n} for n in range(1000)]
    expected = []
    for at in range(0, 1000, 64):
        batch = events[at : at + 64]
        kept = [e for e in batch if e["n"] % 5 == 0]
        context = [e for e in batch if e["n"] % 7 == 0 and e["n"] % 5 != 0]
        expected.append((len(batch), kept, context))
    for sizes in ([1000], [1] * 1000, [63, 1, 64, 65, 0, 807], [500, 500]):
        chunks, at = [], 0
        for size in sizes:
            kept = [
                (n - at, events[n], n % 5 != 0)
                for n in range(at, at + size)
                if n % 5 == 0 or n % 7 == 0
            ]
            chunks.append((size, kept))
            at += size
        assert list(chunk_detect.batches_of(chunks, 64)) == expected


def test_an_engine_that_correlates_before_the_end_is_not_split():
    """Skipping the events no rule matched is exact only when the correlations wait for the
    whole input, as a scan's engine does."""
    scan_pipeline = Pipeline.load(SiteConfig(), None)
    assert chunk_detect.Detect.of(scan_pipeline.ruleset, scan_pipeline.engine) is not None
    agent_like = Pipeline.load(SiteConfig(), None, lateness_s=5.0)
    assert chunk_detect.Detect.of(agent_like.ruleset, agent_like.engine) is None


class UnpicklableRule:
    """A rule whose pySigma object could not be pickled (the rule cache gives up on it too)."""

    kind = "detection"

    def __init__(self) -> None:
        self.sigma = lambda: None


def test_rules_that_cannot_be_pickled_leave_the_workers_to_parse_only():
    engine = Pipeline.load(SiteConfig(), None).engine
    ruleset = RuleSet(rules=[UnpicklableRule()])  # type: ignore[list-item]
    assert chunk_detect.Detect.of(ruleset, engine) is None


def parsed_once_released(
    path: str, start: int, end: int, prepare: chunked.Prepare | None
) -> chunked.ParsedChunk:
    """A worker slow to start: before its first chunk it waits for the caller's go-ahead (a
    file), as a spawned worker takes a while to import and build its engine; 20 s at most,
    so that a caller that stops and waits for it fails the test rather than hangs it."""
    go = Path(path + ".go")
    for _ in range(200 if start == 0 else 0):
        if go.exists():
            break
        threading.Event().wait(0.1)
    return chunked.parse_chunk(path, start, end, prepare)


def test_the_caller_keeps_detecting_while_its_worker_starts(tmp_path, monkeypatch):
    """The caller does up to LOCAL_AHEAD chunks itself ahead of a worker not done yet (not
    three, to then wait out the worker's start-up); the chunks still come in file order."""
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 4096)
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=4)
    done_here: list[int] = []

    def local(path: str, start: int, end: int, prepare: chunked.Prepare | None) -> object:
        done_here.append(start)
        if len(done_here) == chunked.LOCAL_AHEAD:
            Path(path + ".go").touch()  # the worker may go on
        return chunked.parse_chunk(path, start, end, prepare, encode=False)

    with events.open("rb") as stream:
        one = InputReport(str(events))
        expected = list(read_jsonl(stream, one))
        stream.seek(0)
        two = InputReport(str(events))
        chunks = chunked.in_file_order(
            str(events), stream, two, 1, parsed_once_released, None, local
        )
        first = next(chunks)  # the worker's first chunk, once the caller let it go
        here_before_first = len(done_here)
        read = [
            e
            for c in (first, *chunks)
            for a in c.arrays
            for e in (orjson.loads(a) if isinstance(a, bytes) else a)
        ]
    assert here_before_first == chunked.LOCAL_AHEAD
    assert read == expected and two == one


def slow_caller(events: Path, window: int) -> tuple[list[int], list, InputReport]:
    """`events` through one worker (a thread) and a caller slower than it: before taking
    each chunk after its first, the caller waits until the worker has done all it was given.
    Returns how many chunks were handed out ahead of each one taken, the chunks, the report."""
    from concurrent.futures import ThreadPoolExecutor

    handed: list[int] = []
    finished: list[int] = []

    class Pool(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            handed.append(args[1])
            return super().submit(fn, *args, **kwargs)

    def task(path: str, start: int, end: int, prepare: chunked.Prepare | None) -> object:
        parsed = chunked.parse_chunk(path, start, end, prepare)
        finished.append(start)
        return parsed

    leads: list[int] = []
    taken: list = []
    report = InputReport(str(events))
    with events.open("rb") as stream, Pool(1) as pool:
        chunks = chunked.in_file_order(
            str(events),
            stream,
            report,
            1,
            task,
            None,
            None,
            pool,
            window,  # type: ignore[arg-type]
        )
        for chunk in chunks:
            for _ in range(400):  # busy until the worker has done all it was given
                if len(finished) == len(handed):
                    break
                threading.Event().wait(0.01)
            taken.append(chunk)
            leads.append(len(handed) - len(taken))
    return leads, taken, report


def test_a_worker_goes_on_while_the_caller_is_busy_within_the_window(tmp_path, monkeypatch):
    """A caller slower than its worker (busy with what the chunks before kept) lets the
    worker run ahead by up to `window_size` chunks: results it finished and the caller has
    not taken yet do not count against the worker's AHEAD_PER_WORKER (capped there, the
    worker waited on the caller). Never more than `window_size` chunks are out at once,
    which bounds the memory they hold, and they still come in file order."""
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 2048)
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=8)
    window = 7
    leads, chunks, two = slow_caller(events, window)
    with events.open("rb") as stream:
        one = InputReport(str(events))
        expected = list(read_jsonl(stream, one))
    assert len(leads) > 3 * window  # the file was many windows long
    assert max(leads) == window  # the worker ran as far ahead as the window lets it, no further
    assert window > chunked.AHEAD_PER_WORKER + 1
    assert [e for c in chunks for a in c.arrays for e in orjson.loads(a)] == expected
    assert two == one


def test_results_done_and_not_taken_are_bounded_by_their_size_too(tmp_path, monkeypatch):
    """Whatever the window's count, no chunk is handed out while the results done and not
    taken hold WINDOW_BYTES: a file whose every event is kept makes each result a whole
    chunk, and the count alone let 48 of them wait."""
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(chunked, "WINDOW_BYTES", 3 * 2048)
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=8)
    leads, chunks, _ = slow_caller(events, 40)
    assert all(chunk.held_bytes < 2 * 2048 for chunk in chunks)  # about a chunk's JSON each
    assert len(leads) > 20
    assert 3 <= max(leads) <= 3 + chunked.AHEAD_PER_WORKER  # not the 40 of the count


def test_a_chunk_is_detected_list_by_list_as_one_whole_list_would_be(tmp_path, monkeypatch):
    """A worker parses, prepares and evaluates a chunk PARSE_BATCH lines at a time (the
    events still in the CPU cache), never the whole chunk at once; what it keeps, and their
    positions among the chunk's valid events, are those of the chunk evaluated whole,
    malformed lines and gpu_process context included."""
    monkeypatch.setattr(chunked, "PARSE_BATCH", 7)
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=3)
    size = events.stat().st_size
    pipeline = Pipeline.load(SiteConfig(), None)
    detect = chunk_detect.Detect.of(pipeline.ruleset, pipeline.engine)
    assert detect is not None
    prepare = chunked.Prepare(SiteConfig(), {})

    engine = detect.engine()
    sizes: list[int] = []
    real = engine.evaluate

    def counted(batch: list[Event]) -> list:
        sizes.append(len(batch))
        return real(batch)

    monkeypatch.setattr(engine, "evaluate", counted)
    got = chunk_detect.detect_chunk(str(events), 0, size, prepare, detect, engine)

    with events.open("rb") as stream:
        report = InputReport(str(events))
        whole = list(read_jsonl(stream, report))
    prepare.apply(whole)
    matched = {id(m.events[0]) for m in detect.engine().evaluate(whole)}
    kept = [
        (n, e if e["event.category"] != "gpu_process" or id(e) in matched else None)
        for n, e in enumerate(whole)
        if id(e) in matched or e["event.category"] in ("gpu_device", "gpu_process")
    ]
    assert len(sizes) > 20 and max(sizes) <= 7
    assert got.positions == [n for n, _ in kept] and len(got.positions) > 10
    assert [e for (_, e) in kept if e is not None] == [
        e for i, e in enumerate(got.kept) if i not in set(got.context)
    ]
    assert (got.lines, got.events, got.malformed, got.malformed_lines) == (
        report.lines,
        report.events,
        report.malformed,
        report.malformed_lines,
    )
    assert got.malformed > 0


PLACEHOLDER_RULES = """\
title: A miner, whatever the category
id: 7c1d2e3f-0000-4000-8000-000000000001
name: any_miner
status: test
logsource: {product: hpc}
detection:
  selection:
    process.name|expand: '%miner_names%'
  condition: selection
level: low
"""
MINER_COUNTS = [
    """\
title: Miners on one host
id: 7c1d2e3f-0000-4000-8000-000000000002
status: test
correlation:
  type: event_count
  rules: [any_miner]
  group-by: [host.name]
  timespan: 5m
  condition: {gte: 2}
level: high
""",
    """\
title: One miner thrice
id: 7c1d2e3f-0000-4000-8000-000000000003
status: test
correlation:
  type: event_count
  rules: [any_miner]
  group-by: [process.name]
  timespan: 5m
  condition: {gte: 3}
level: high
""",
]


def test_the_worker_of_the_correlation_pass_has_the_configs_placeholders(
    tmp_path, capfd, small_chunks, monkeypatch, worker_parts
):
    """A rule for every category is compiled with the worker's engine: without the config's
    placeholder values it would warn, on the scan's stderr, that its values match nothing."""
    rules = tmp_path / "miners.yml"
    rules.write_text("---\n".join([PLACEHOLDER_RULES, *MINER_COUNTS]))
    events = tmp_path / "events.jsonl"
    lines = [
        json.dumps(
            {
                "@timestamp": f"2026-12-01T10:{n // 60:02d}:{n % 60:02d}Z",
                "event.category": "process",
                "event.action": "exec",
                "host.name": f"n{n % 7}",
                "process.name": "xmrig" if n % 3 else "ls",
                "event.id": str(n),
            }
        )
        for n in range(3000)
    ]
    events.write_text("\n".join(lines) + "\n")
    argv = ["scan", "--format", "jsonl", "--no-default-rules", "--rules", str(rules)]
    serial = main([*argv, "--events", str(events), "--jobs", "1"]), capfd.readouterr()
    split_always(monkeypatch)
    parallel = main([*argv, "--events", str(events), "--jobs", "2"]), capfd.readouterr()
    assert parallel == serial
    assert "placeholder" not in serial[1].err
    assert len(worker_parts) == 1 and worker_parts[0] > 0  # the worker did a part
