"""Quick thread switches (core/switching.py) while a process computes beside its workers:
shortened within the block, put back after the last user, and in force where the caller
parses or evaluates beside a pool (a rule load, a scan's chunks, the correlation pass)."""

from __future__ import annotations

import sys
import threading

import pytest

from hpcsec.detector.core import switching
from hpcsec.detector.core.switching import QUICK_SWITCH_S, quick_thread_switches
from hpcsec.detector.engine import flush_parts
from hpcsec.detector.runtime import chunked


@pytest.fixture(autouse=True)
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_short_within_the_block_and_as_it_was_after():
    with quick_thread_switches():
        assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_S)
        with quick_thread_switches():  # nested: still short, and the outer one restores
            assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_S)
        assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    with pytest.raises(RuntimeError), quick_thread_switches():
        raise RuntimeError("the block failed")
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_already_shorter_is_kept():
    sys.setswitchinterval(QUICK_SWITCH_S / 5)
    shorter = sys.getswitchinterval()  # as the interpreter keeps it (whole microseconds)
    with quick_thread_switches():
        assert sys.getswitchinterval() == shorter
    assert sys.getswitchinterval() == shorter


def test_users_in_two_threads_leave_it_as_it_was_whatever_order_they_leave_in():
    entered, release = threading.Barrier(2), threading.Event()

    def user() -> None:
        with quick_thread_switches():
            entered.wait()
            release.wait()

    other = threading.Thread(target=user)
    other.start()
    with quick_thread_switches():
        entered.wait()
        release.set()
        other.join()  # the other thread left first: still short for this one
        assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert switching._INTERVAL.users == 0


def test_a_scans_chunks_are_taken_with_quick_switches(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text('{"event.category": "process", "process.name": "nc"}\n' * 50)
    seen: list[float] = []

    def local(path: str, start: int, end: int, prepare: chunked.Prepare | None):
        seen.append(sys.getswitchinterval())
        return chunked.parse_chunk(path, start, end, prepare, encode=False)

    with events.open("rb") as stream:
        report = chunked.InputReport(str(events))
        for _ in chunked.in_file_order(str(events), stream, report, 1, local, None, local):
            seen.append(sys.getswitchinterval())
    assert seen and all(s == pytest.approx(QUICK_SWITCH_S) for s in seen)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_the_correlation_pass_runs_with_quick_switches(monkeypatch):
    class Spied:
        correlations = ()

        def flush(self) -> list:
            seen.append(sys.getswitchinterval())
            return []

    seen: list[float] = []
    assert flush_parts.flush(Spied(), None, 0) == []  # type: ignore[arg-type]
    assert seen == [pytest.approx(QUICK_SWITCH_S)]
    assert sys.getswitchinterval() == pytest.approx(0.005)
