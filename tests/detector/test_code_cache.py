"""Compiled match code kept in the private cache directory (engine/codecache.py)."""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import pytest

from hpcsec.detector.engine import codecache
from hpcsec.detector.engine.evaluate import Engine
from tests.detector.test_engine_semantics import HEADER, ruleset

RULE = HEADER + "detection:\n  sel:\n    process.name|contains: [miner, xmrig]\n  condition: sel\n"


@pytest.fixture
def compiles(monkeypatch) -> list[str]:
    """The file names Python's compiler is asked to compile, from now on."""
    asked: list[str] = []
    real = builtins.compile

    def counted(source, filename, *args, **kwargs):
        asked.append(filename)
        return real(source, filename, *args, **kwargs)

    monkeypatch.setattr(codecache, "compile", counted, raising=False)
    return asked


def private(tmp_path: Path) -> Path:
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    return directory


def fires(engine: Engine, name: str) -> bool:
    return bool(engine.evaluate([{"event.category": "process", "process.name": name}]))


def test_the_same_rules_compile_once(tmp_path, compiles):
    cache = private(tmp_path)
    first = Engine(ruleset(RULE), code_cache=cache)
    assert compiles == ["<hpcsec rules match_process>"]
    assert [n for n in os.listdir(cache) if n.startswith(codecache.PREFIX)]
    second = Engine(ruleset(RULE), code_cache=cache)
    assert compiles == ["<hpcsec rules match_process>"]  # read back, not compiled again
    for engine in (first, second):
        assert fires(engine, "XMRig-6") and not fires(engine, "python3")


def test_other_rules_are_other_code(tmp_path, compiles):
    cache = private(tmp_path)
    Engine(ruleset(RULE), code_cache=cache)
    other = Engine(ruleset(RULE.replace("xmrig", "nanominer")), code_cache=cache)
    assert len(compiles) == 2
    assert fires(other, "nanominer") and not fires(other, "xmrig")


def test_a_damaged_entry_is_compiled_again(tmp_path, compiles):
    cache = private(tmp_path)
    Engine(ruleset(RULE), code_cache=cache)
    (name,) = [n for n in os.listdir(cache) if n.startswith(codecache.PREFIX)]
    data = bytearray((cache / name).read_bytes())
    data[-5] ^= 0xFF  # a bit flipped in the code: its checksum no longer holds
    (cache / name).write_bytes(bytes(data))
    engine = Engine(ruleset(RULE), code_cache=cache)
    assert len(compiles) == 2 and fires(engine, "xmrig")


def test_a_cache_others_can_write_is_not_used(tmp_path, compiles):
    cache = private(tmp_path)
    cache.chmod(0o777)
    Engine(ruleset(RULE), code_cache=cache)
    Engine(ruleset(RULE), code_cache=cache)
    assert len(compiles) == 2 and not os.listdir(cache)


def test_entries_beyond_the_bound_go_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setattr(codecache, "MAX_ENTRIES", 2)
    cache = private(tmp_path)
    names = []
    for n in range(3):
        source = f"x = {n}"
        names.append(codecache.entry_name(source, "<t>"))
        code = codecache.compiled(source, "<t>", cache)
        namespace: dict = {}
        exec(code, namespace)
        assert namespace["x"] == n
        os.utime(cache / names[-1], ns=(n * 10**9, n * 10**9))
        if n == 1:  # the first is used again: the second is now the least recently used
            codecache.compiled("x = 0", "<t>", cache)
    assert sorted(os.listdir(cache)) == sorted([names[0], names[2]])
