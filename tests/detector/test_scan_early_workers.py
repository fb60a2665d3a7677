"""`scan --events --jobs 2` starts its worker before it loads its rules, so the worker's
start overlaps that load and the firmware pass; a worker has its engine built before its
first chunk; a worker that dies that early costs only speed, never an alert."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.runtime import chunk_detect, chunked
from hpcsec.detector.runtime.pipeline import Pipeline
from tests.detector.test_scan_parallel import write_events


def scan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["scan", "--format", "jsonl", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def workers_during_load(monkeypatch: pytest.MonkeyPatch, kill: bool) -> list[int]:
    """Pipeline.load made to record how many worker processes are alive while it runs (and
    to kill them first when `kill`)."""
    alive: list[int] = []
    real = Pipeline.load.__func__

    def load(cls: type[Pipeline], *args: object, **kwargs: object) -> Pipeline:
        children = multiprocessing.active_children()
        alive.append(len(children))
        for child in children if kill else ():
            if child.pid is not None:
                with contextlib.suppress(ProcessLookupError):  # reaped already: dead anyway
                    os.kill(child.pid, signal.SIGKILL)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "load", classmethod(load))
    return alive


def test_the_worker_starts_before_the_rules_load(tmp_path, capsys, small_chunks, monkeypatch):
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=3)
    serial = scan(capsys, "--events", str(events), "--jobs", "1")
    alive = workers_during_load(monkeypatch, kill=False)
    assert scan(capsys, "--events", str(events), "--jobs", "2") == serial
    assert alive == [1]
    assert small_chunks == []


def test_a_worker_killed_while_the_rules_load_gives_the_same_output(
    tmp_path, capsys, small_chunks, monkeypatch
):
    """Its chunks are then parsed and evaluated in the caller."""
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=3)
    serial = scan(capsys, "--events", str(events), "--jobs", "1")
    alive = workers_during_load(monkeypatch, kill=True)
    assert scan(capsys, "--events", str(events), "--jobs", "2") == serial
    assert alive == [1]
    assert small_chunks  # no worker left: chunks parsed here


def test_no_worker_starts_where_the_scan_would_not_use_it(tmp_path, monkeypatch):
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"{}\n" * 10)
    assert small.stat().st_size < chunked.PARALLEL_MIN_BYTES
    assert chunk_detect.start_workers(str(small), 2) is None
    below = tmp_path / "below.jsonl"  # a worker would cost more than it saves (chunked.py)
    with below.open("wb") as sparse:
        sparse.truncate(17 * 2**20)
    assert chunk_detect.start_workers(str(below), 2) is None
    monkeypatch.setattr(chunked, "PARALLEL_MIN_BYTES", 0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, jobs in ((str(small), 1), ("-", 2), (None, 2), (str(fifo), 2), (str(tmp_path), 2)):
        assert chunk_detect.start_workers(path, jobs) is None
    assert chunk_detect.start_workers(str(tmp_path / "absent"), 2) is None
    pool = chunk_detect.start_workers(str(small), 3)
    assert pool is not None
    with pool:
        assert pool._max_workers == 2


def engines_held() -> list[bytes]:
    """In a worker: the digests of the engines it holds."""
    return list(chunk_detect._engines)


def test_a_started_worker_builds_its_engine_before_its_first_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(chunked, "PARALLEL_MIN_BYTES", 0)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"{}\n")
    pipeline = Pipeline.load(SiteConfig(), None)
    detect = chunk_detect.Detect.of(pipeline.ruleset, pipeline.engine)
    assert detect is not None
    pool = chunk_detect.start_workers(str(path), 2)
    assert pool is not None
    with pool:
        assert pool.submit(engines_held).result() == []
        chunk_detect.build_engine(pool, detect)
        assert pool.submit(engines_held).result() == [detect.digest]


def test_a_dead_pool_is_no_error_when_the_engine_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(chunked, "PARALLEL_MIN_BYTES", 0)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"{}\n")
    pool = chunk_detect.start_workers(str(path), 2)
    assert pool is not None
    with pool:
        pid = pool.submit(os.getpid).result()
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            pool.submit(os.getpid).result()  # the pool sees its worker die: broken
        chunk_detect.build_engine(pool, chunk_detect.Detect(b"", b""))
