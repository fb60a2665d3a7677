"""Fixtures shared by the detector's test modules."""

from __future__ import annotations

import pytest

from hpcsec.detector.runtime import chunked


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """`scan --events` parallel from the first byte, in chunks of 4 KiB; returns the chunks
    parsed in the caller because no worker could (a worker died or raised), not those the
    caller detected itself while waiting for its worker."""
    in_caller: list[tuple[int, int]] = []
    monkeypatch.setattr(chunked, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 4096)
    parse_here = chunked.parse_in_caller

    def counted(
        path: str, start: int, end: int, prepare: chunked.Prepare | None
    ) -> chunked.ParsedChunk:
        in_caller.append((start, end))
        return parse_here(path, start, end, prepare)

    monkeypatch.setattr(chunked, "parse_in_caller", counted)
    return in_caller
