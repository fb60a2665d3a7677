"""The worker processes of a cold rule load (coldload.in_parallel), started before the caller
imports the parser: a spawned worker spends about as long on its interpreter and pySigma's
imports as the caller spends on the same imports, so starting it first lets both be ready to
parse at about the same time. Imports nothing of the parser itself (loader.py uses it on a
miss, before coldload.py).

Each worker reads the parse's files from an unlinked file (`Workers.send`); then the caller
and its workers share nothing but two numbers, the next group from the front and the end of
what is left (`Claims`): each worker takes groups from the front, the caller from the end,
until they meet. A worker writes each group's entries to a file of its own and sends
where they lie; the caller takes them in between its own groups. No thread of the caller
passes tasks or results meanwhile. A process pool's threads did: each needed the
GIL several times per task, and a caller that let them have it at once (a 0.5 ms switch
interval) parsed its own files 40% slower than its worker did (bench/rule_load.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import socket
import tempfile
from collections.abc import Iterator, Sequence
from multiprocessing import reduction
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hpcsec.detector.core.log import get_logger

logger = get_logger(__name__)

# Fewer files than this parse in the caller. A spawned worker costs about 0.3 s of CPU (its
# interpreter and pySigma's imports) before its first file, and a SigmaHQ file about 1 ms to
# parse: below a second of parsing the caller would mostly wait for it (bench/rule_load.py).
PARALLEL_MIN_FILES = 1000
# How long a claim waits for the claims' lock, held for microseconds at a time: past it, the
# holder is taken to have died holding it (a lock between processes outlives its holder).
CLAIM_TIMEOUT_S = 5.0

Item = tuple[Path, bytes | None]  # a rule file, and its bytes when read already


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
    """Which groups are left: [front, end) of a shared array, under its lock. A process that
    cannot take the lock within `timeout_s` (one died holding it: the OOM killer) claims
    nothing more; what nobody sent back is parsed by the caller."""

    def __init__(self, shared: Any, timeout_s: float):
        self.shared = shared  # multiprocessing Array("q", 2): front, end
        self.timeout_s = timeout_s
        self.broken = False  # this process waited for the lock in vain: it waits no more

    @contextlib.contextmanager
    def _held(self) -> Iterator[bool]:
        lock = self.shared.get_lock()
        held = not self.broken and lock.acquire(timeout=self.timeout_s)
        self.broken = not held
        try:
            yield held
        finally:
            if held:
                lock.release()

    def reset(self, groups: int) -> bool:
        """All `groups` left; False when the lock cannot be had."""
        with self._held() as held:
            if held:
                self.shared[0], self.shared[1] = 0, groups
            return held

    def front(self) -> int | None:
        """The next group from the front (a worker's), None when none is left."""
        with self._held() as held:
            first, end = (self.shared[0], self.shared[1]) if held else (0, 0)
            if first >= end:
                return None
            self.shared[0] = first + 1
            return int(first)

    def end(self) -> int | None:
        """The last group left (the caller's), None when none is left."""
        with self._held() as held:
            first, end = (self.shared[0], self.shared[1]) if held else (0, 0)
            if first >= end:
                return None
            self.shared[1] = end - 1
            return int(end - 1)

    def close(self) -> None:
        """No group left for anyone: a worker stops after the group it is parsing."""
        with self._held() as held:
            if held:
                self.shared[1] = self.shared[0]


class Workers:
    """Worker processes started for one parse, each waiting for its task on its connection.
    Whoever started them stops them (`stop`), or hands them to coldload.in_parallel."""

    def __init__(self, claims: Claims):
        self.claims = claims
        self.processes: list[Any] = []
        self.connections: list[Connection] = []
        self.outputs: dict[Connection, int] = {}  # per worker given a task: its entries' file
        self.pending: list[Connection] = []  # connections whose worker may send more

    def send(self, items: Sequence[Item], threshold_values: Any, group_files: int) -> int:
        """The parse's files to every worker (each takes groups of `group_files` by the
        claims); how many workers took it.

        The task is written once to an unlinked temporary file, and each worker is sent its
        descriptor and that of an unlinked file of its own for its entries: a send never
        waits for a worker still importing the parser (as a send of SigmaHQ's 6 MB of rule
        files down a pipe would), and a worker never waits for the caller to read what it
        parsed (it writes the entries to its file and sends where they lie, a few bytes)."""
        try:
            with tempfile.TemporaryFile() as task:
                pickle.dump(
                    (list(items), threshold_values, group_files),
                    task,
                    protocol=pickle.HIGHEST_PROTOCOL,
                )
                task.flush()
                for connection in self.connections:
                    self._send_to(connection, task.fileno())
        except OSError as exc:  # no temporary file: the caller parses every file, and says so
            logger.warning(
                "rule load: no temporary file for its worker processes (%s): parsing %d "
                "files in one process",
                exc.strerror or exc,
                len(items),
            )
        return len(self.pending)

    def _send_to(self, connection: Connection, task: int) -> None:
        with tempfile.TemporaryFile(buffering=0) as output:
            try:
                with _channel(connection) as channel:
                    reduction.sendfds(channel, [task, output.fileno()])
            except OSError:  # a worker gone already: its groups fall back to the caller
                return
            self.outputs[connection] = os.dup(output.fileno())  # read until stop()
        self.pending.append(connection)

    def ready(self, wait: bool = False) -> Iterator[tuple[int, list[bytes | None] | None]]:
        """(group, its entries, or None when its parse raised) for each group a worker has
        parsed since the last call; with `wait`, every group until each worker is done or
        gone (a worker that died sends no more: its groups fall back to the caller)."""
        for connection in list(self.pending):
            output = self.outputs[connection]
            while wait or connection.poll(0):
                try:
                    note = connection.recv()
                except (EOFError, OSError, ValueError):
                    note = None
                if note is None:  # done, or gone
                    self.pending.remove(connection)
                    break
                yield _entries(output, note)

    def stop(self) -> None:
        """Stop giving out groups and let the workers go. Not waited for: a worker's exit (its
        interpreter's teardown) took 0.3-0.7 s of a 3.7 s cold load of SigmaHQ's rules,
        which the caller would spend waiting; a worker reaped later meanwhile is harmless."""
        self.claims.close()
        for connection in self.connections:
            connection.close()  # a worker waiting for its task or to send results: it ends
        for output in self.outputs.values():
            with contextlib.suppress(OSError):
                os.close(output)
        for process, connection in zip(self.processes, self.connections, strict=True):
            with contextlib.suppress(Exception):
                if connection not in self.outputs:
                    # never given a task (the parser's import failed, an early Ctrl-C): it
                    # may still be starting, and its arguments' lock be gone when it reads
                    # them; stopped rather than left to print a traceback about it
                    process.terminate()
                process.join(0)  # reaped now if it has ended
        self.outputs, self.pending = {}, []


def _channel(connection: Connection) -> socket.socket:
    """The connection's socket, to pass descriptors on: blocking whatever the process's
    default socket timeout (a timeout would make the connection's descriptor, which it
    shares, non-blocking, and its next wait for a note fail)."""
    channel = socket.socket(fileno=os.dup(connection.fileno()))
    channel.setblocking(True)
    return channel


def _entries(output: int, note: Any) -> tuple[int, list[bytes | None] | None]:
    """The entries of a worker's note (group, offset, length) read from its file."""
    index, offset, length = note
    if offset < 0:
        return index, None
    return index, pickle.loads(_read_at(output, offset, length))


def _read_at(fd: int, offset: int, length: int) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            raise EOFError("a worker's entries end early")
        chunks.append(chunk)
        offset, length = offset + len(chunk), length - len(chunk)
    return b"".join(chunks)


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
        workers = Workers(Claims(context.Array("q", 2), CLAIM_TIMEOUT_S))
    except OSError:  # no semaphore for the claims' lock (a /dev/shm that is full, say)
        return None
    for _ in range(count):
        mine, theirs = context.Pipe(duplex=True)
        process = context.Process(target=serve, args=(theirs, workers.claims), daemon=True)
        try:
            process.start()
        except Exception:  # no process can start (out of them; a daemonic caller): the
            # groups are the caller's
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
    from the front until none is left, each group's entries written to its output file and
    where they lie sent to the caller; None when done."""
    with contextlib.suppress(KeyboardInterrupt):  # a Ctrl-C reaches the caller, which says so
        _serve(connection, claims)


def _serve(connection: Connection, claims: Claims) -> None:
    from hpcsec.detector.engine.coldload import parse_group

    try:
        with _channel(connection) as channel:
            task, output = reduction.recvfds(channel, 2)
    except (EOFError, OSError, RuntimeError):  # the caller stopped before sending any
        return
    try:
        items, threshold_values, group_files = pickle.loads(
            _read_at(task, 0, os.fstat(task).st_size)  # pread: the workers share the offset
        )
        os.close(task)
        offset = 0
        while (index := claims.front()) is not None:
            group = items[index * group_files : (index + 1) * group_files]
            try:
                entries = pickle.dumps(
                    parse_group(group, threshold_values), protocol=pickle.HIGHEST_PROTOCOL
                )
            except Exception:  # the caller parses this group, and says what is wrong with it
                connection.send((index, -1, 0))
                continue
            written = 0
            while written < len(entries):
                written += os.pwrite(output, entries[written:], offset + written)
            connection.send((index, offset, len(entries)))
            offset += len(entries)
        connection.send(None)
    except OSError:  # the caller gone: nobody left to tell
        pass
