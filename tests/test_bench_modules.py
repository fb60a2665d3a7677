"""Every benchmark still runs against the code it measures: each module imports (a renamed
internal breaks it here, not in a benchmark run), each named one answers --help, and the
file-access folding path runs a few events (no root needed)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from bench.__main__ import BENCHES

MODULES = sorted(p.stem for p in (Path(__file__).parents[1] / "bench").glob("*.py"))


@pytest.mark.parametrize("name", MODULES)
def test_each_bench_module_imports(name):
    importlib.import_module(f"bench.{name}")


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_each_named_bench_answers_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        importlib.import_module(BENCHES[name]).main(["--help"])
    assert done.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_the_file_access_folding_path_runs():
    from bench.file_access import folding_rate

    assert folding_rate(2000) > 0
