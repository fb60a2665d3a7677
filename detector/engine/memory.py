"""Memory the engine hands back to the system, and when the cyclic garbage collector runs
while rules are parsed and compiled."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable, Iterator


def return_freed_memory() -> None:
    """Hand the heap that compiling freed back to the system. Compiling a category allocates
    far more (the generated source, its syntax tree, the compiler's own) than the function
    keeps, and glibc keeps freed memory in the process unless told: SigmaHQ's 3,754 rules
    would stay at some 190 MB resident instead of 145. Where there is no malloc_trim (not
    glibc) the memory stays with the process's allocator. Costs well under a millisecond."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


@contextlib.contextmanager
def _collector_off(then: Callable[[], object]) -> Iterator[None]:
    """The cyclic garbage collector off for the block; `then()` before it is on again (not
    at all when it was off already)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            then()
            gc.enable()


def _unexamined_to_oldest() -> None:
    # what the block allocated goes to the oldest generation unexamined: enabled as it is,
    # the next allocation would walk all of it as one young generation
    gc.freeze()
    gc.unfreeze()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a parse: every rule parsed stays alive, so each
    full collection walks all the rules so far again, a third of a cold load's CPU in the
    caller. What a parse leaves as garbage is a file's worth at most (its YAML nodes, a
    rejected rule's objects), freed by reference counting or by the next full collection.
    Process-wide: other threads' cycles wait for the load's end too."""
    with _collector_off(_unexamined_to_oldest):
        yield


@contextlib.contextmanager
def young_collected() -> Iterator[None]:
    """The cyclic garbage collector off while a category compiles, then one collection of
    the young generations: what the compile made (the rules' condition trees and pySigma
    objects it let go, cyclic through their parent links), not the whole heap. Left on, the
    objects a compile keeps set off full collections, each walking every rule and event in
    memory: 15 of them, 5 of the 12 s of CPU a lazy engine spent compiling SigmaHQ's 136
    categories, against 1.5 s for one young collection after each (bench sigmahq). Unlike
    gc_paused, the compile's garbage is freed before the engine hands memory back.
    Process-wide: other threads' young cycles wait for the compile's end too."""
    with _collector_off(lambda: gc.collect(1)):
        yield
