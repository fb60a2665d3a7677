"""The worker processes of a cold rule load (coldload.in_parallel), started before the caller
imports the parser: a spawned worker spends about as long on its interpreter and pySigma's
imports as the caller spends on the same imports, so starting it first lets both be ready to
parse at about the same time. Imports nothing of the parser itself (loader.py uses it on a
miss, before coldload.py)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import NamedTuple

# Fewer files than this parse in the caller. A spawned worker costs about 0.5 s of CPU (its
# interpreter and pySigma's imports) before its first file, and a SigmaHQ file about 1 ms to
# parse: below a second of parsing the caller would mostly wait for it (bench/rule_load.py).
PARALLEL_MIN_FILES = 1000


def workers_for(files: int) -> int:
    """Worker processes for a parse of `files` files beside the caller: one per other CPU,
    each with PARALLEL_MIN_FILES files or more to parse."""
    if files < PARALLEL_MIN_FILES:
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(0, min(cpus - 1, files // PARALLEL_MIN_FILES))


class Workers(NamedTuple):
    pool: ProcessPoolExecutor  # owned by whoever started it: shut down, or a `with` block
    processes: int


def start_workers(files: int) -> Workers | None:
    """Worker processes for a parse of `files` files, already importing the parser; None when
    the caller parses them alone."""
    workers = workers_for(files)
    if workers == 0:
        return None
    # spawned, not forked: the caller may hold threads (the agent's)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        for _ in range(workers):  # each submit starts one more process, up to `workers`
            pool.submit(_import_parser)
    except BrokenProcessPool:  # no worker can start: the groups handed to it fall back
        pass
    return Workers(pool, workers)


@contextlib.contextmanager
def stopped_on_error(workers: Workers | None) -> Iterator[None]:
    """Shuts `workers` down when the block raises (the parser's import failing), before
    anything has taken them over: their processes would otherwise live on until exit."""
    try:
        yield
    except BaseException:
        if workers is not None:
            workers.pool.shutdown(wait=False, cancel_futures=True)
        raise


def _import_parser() -> None:
    """A worker's first task: the parser's imports, while the caller does its own."""
    import hpcsec.detector.engine.coldload  # noqa: F401  # the point: imported in the worker
