"""The worker processes of a cold rule load (coldload.in_parallel), started before the caller
imports the parser: a spawned worker spends about as long on its interpreter and pySigma's
imports as the caller spends on the same imports, so starting it first lets both be ready to
parse at about the same time. Imports nothing of the parser itself (loader.py uses it on a
miss, before coldload.py).

Each worker reads the parse's files from an unlinked file (`Workers.send`); then the caller
and its workers share nothing but two numbers, the next group from the front and the end of
what is left (`Claims`): each worker takes groups from the front, the caller from the end,
until they meet; a worker sends all its results at once when none is left. No thread
of the caller passes tasks or results meanwhile. A process pool's threads did: each needed the
GIL several times per task, and a caller that let them have it at once (a 0.5 ms switch
interval) parsed its own files 40% slower than its worker did (bench/rule_load.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import tempfile
from collections.abc import Iterator, Sequence
from multiprocessing import reduction
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# Fewer files than this parse in the caller. A spawned worker costs about 0.3 s of CPU (its
# interpreter and pySigma's imports) before its first file, and a SigmaHQ file about 1 ms to
# parse: below a second of parsing the caller would mostly wait for it (bench/rule_load.py).
PARALLEL_MIN_FILES = 1000

Item = tuple[Path, bytes | None]  # a rule file, and its bytes when read already
# what a worker sends back: group index -> one entry per file (None: the caller parses the
# file), or None for a group whose parse raised (the caller parses all of it)
Results = dict[int, list[bytes | None] | None]


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


class Claims:
    """Which groups are left: [front, end) of a shared array, under its lock."""

    def __init__(self, shared: Any):
        self.shared = shared  # multiprocessing Array("q", 2): front, end

    def reset(self, groups: int) -> None:
        with self.shared.get_lock():
            self.shared[0], self.shared[1] = 0, groups

    def front(self) -> int | None:
        """The next group from the front (a worker's), None when none is left."""
        with self.shared.get_lock():
            first, end = self.shared[0], self.shared[1]
            if first >= end:
                return None
            self.shared[0] = first + 1
            return int(first)

    def end(self) -> int | None:
        """The last group left (the caller's), None when none is left."""
        with self.shared.get_lock():
            first, end = self.shared[0], self.shared[1]
            if first >= end:
                return None
            self.shared[1] = end - 1
            return int(end - 1)

    def close(self) -> None:
        """No group left for anyone: a worker stops after the group it is parsing."""
        with self.shared.get_lock():
            self.shared[1] = self.shared[0]


class Workers:
    """Worker processes started for one parse, each waiting for its task on its connection.
    Whoever started them stops them (`stop`), or hands them to coldload.in_parallel."""

    def __init__(self, claims: Claims):
        self.claims = claims
        self.processes: list[Any] = []
        self.connections: list[Connection] = []

    def send(self, items: Sequence[Item], threshold_values: Any, group_files: int) -> int:
        """The parse's files to every worker (each takes groups of `group_files` by the
        claims); how many workers took it. The task is written once to an unlinked temporary
        file whose descriptor each worker receives: a send never waits for a worker still
        importing the parser, as a send of SigmaHQ's 6 MB of rule files down a pipe would."""
        try:
            with tempfile.TemporaryFile() as task:
                pickle.dump(
                    (list(items), threshold_values, group_files),
                    task,
                    protocol=pickle.HIGHEST_PROTOCOL,
                )
                task.flush()
                taken = 0
                for connection, process in zip(self.connections, self.processes, strict=True):
                    try:
                        reduction.send_handle(connection, task.fileno(), process.pid)
                        taken += 1
                    except (OSError, ValueError):  # a worker gone already: its groups fall back
                        pass
                return taken
        except OSError:  # no temporary file: the caller parses every file
            return 0

    def results(self) -> Results:
        """What every worker parsed (waits for each to send it); a worker lost sends none."""
        results: Results = {}
        for connection in self.connections:
            # a worker that died sends nothing: its groups fall back to the caller
            with contextlib.suppress(EOFError, OSError, ValueError):
                results.update(connection.recv())
        return results

    def stop(self) -> None:
        """Stop giving out groups and let the workers go. Not waited for: a worker's exit (its
        interpreter's teardown) took 0.3-0.7 s of a 3.7 s cold load of SigmaHQ's rules,
        which the caller would spend waiting; a worker reaped later meanwhile is harmless."""
        self.claims.close()
        for connection in self.connections:
            connection.close()  # a worker waiting for its task or to send results: it ends
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.join(0)  # reaped now if it has ended


def start_workers(files: int) -> Workers | None:
    """Worker processes for a parse of `files` files, already importing the parser; None when
    the caller parses them alone."""
    count = workers_for(files)
    if count == 0:
        return None
    # spawned, not forked: the caller may hold threads (the agent's); daemonic, so that an
    # interpreter's exit stops one that is still running rather than waiting for it
    context = multiprocessing.get_context("spawn")
    try:
        workers = Workers(Claims(context.Array("q", 2)))
    except OSError:  # no semaphore for the claims' lock (a /dev/shm that is full, say)
        return None
    for _ in range(count):
        mine, theirs = context.Pipe(duplex=True)
        process = context.Process(target=serve, args=(theirs, workers.claims), daemon=True)
        try:
            process.start()
        except OSError:  # no process can start: the groups are the caller's
            mine.close()
            break
        finally:
            theirs.close()
        workers.processes.append(process)
        workers.connections.append(mine)
    return workers if workers.processes else None


@contextlib.contextmanager
def stopped_on_error(workers: Workers | None) -> Iterator[None]:
    """Stops `workers` when the block raises (the parser's import failing), before anything
    has taken them over: they would otherwise wait for a task until the caller's exit."""
    try:
        yield
    except BaseException:
        if workers is not None:
            workers.stop()
        raise


def serve(connection: Connection, claims: Claims) -> None:
    """A worker: the parser's imports (while the caller does its own), its task, then groups
    from the front until none is left, and all their entries sent back at once."""
    from hpcsec.detector.engine.coldload import parse_group

    try:
        task = reduction.recv_handle(connection)
    except (EOFError, OSError, RuntimeError):  # the caller stopped before sending any
        return
    try:
        # pread: the workers share the file's offset
        items, threshold_values, group_files = pickle.loads(
            os.pread(task, os.fstat(task).st_size, 0)
        )
    finally:
        os.close(task)
    results: Results = {}
    while (index := claims.front()) is not None:
        group = items[index * group_files : (index + 1) * group_files]
        try:
            results[index] = parse_group(group, threshold_values)
        except Exception:  # the caller parses this group, and says what is wrong with it
            results[index] = None
    with contextlib.suppress(OSError):  # the caller gone: nobody left to tell
        connection.send(results)
