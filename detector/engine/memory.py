"""Memory the engine hands back to the system."""

from __future__ import annotations

import ctypes


def return_freed_memory() -> None:
    """Hand the heap that compiling freed back to the system. Compiling a category allocates
    far more (the generated source, its syntax tree, the compiler's own) than the function
    keeps, and glibc keeps freed memory in the process unless told: SigmaHQ's 3,754 rules
    would stay at some 190 MB resident instead of 145. Where there is no malloc_trim (not
    glibc) the memory stays with the process's allocator. Costs well under a millisecond."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
