"""Start-up cost of the short commands: CPU seconds and peak RSS of a fresh process.

`python -m bench.startup [--repeat N]`

Each command runs `--repeat` times (default 5) as its own process; the figure is the median
of user + system CPU (from wait4's rusage, so other load on the machine does not count) and
the peak RSS. The peer is `python -c pass` in the same run: the interpreter's own start.
Target: <= 0.15 s CPU for `--help`, `slurm prolog` (and `epilog`), `rules list` and
`config check`.

The rule cache is a scratch one: the first run of `rules list` and `config check` parses the
bundled rules with pySigma and writes it (column `1st run`, not in the median); the runs
measured read the rule headers from it and import no pySigma.

An installed wheel carries compiled .pyc files; a source tree has them only once compiled
(`make` bootstraps with `python -m compileall`), and without them every run compiles each
module it imports again (PYTHONDONTWRITEBYTECODE forbids writing them). The first line says how
many of the package's modules have a current .pyc: figures taken without are not what users get.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_CPU_S = 0.15
HPCSEC = [sys.executable, "-m", "hpcsec.detector.cli.main"]
PACKAGE_DIRS = ("detector", "sensors")


def pyc_is_current(source: Path) -> bool:
    """Whether Python would use the .pyc of `source` as it is: one written by this
    interpreter for the source's current mtime and size (the default, timestamp-checked kind)."""
    try:
        header = Path(importlib.util.cache_from_source(str(source))).read_bytes()[:16]
        info = source.stat()
    except OSError:
        return False
    if header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(header[4:8], "little"):  # a hash-based .pyc (PEP 552): not the default
        return True
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    return mtime == int(info.st_mtime) & 0xFFFFFFFF and size == info.st_size & 0xFFFFFFFF


def bytecode_line() -> str:
    sources = sorted(p for d in PACKAGE_DIRS for p in (REPO / d).rglob("*.py"))
    current = sum(pyc_is_current(p) for p in sources)
    line = f"bytecode: {current} of {len(sources)} modules have a current .pyc"
    if current < len(sources):
        line += " (the others are compiled on every run: `python -m compileall detector sensors`)"
    return line


def commands(state_dir: str) -> dict[str, list[str]]:
    config = str(REPO / "examples" / "site-config.yml")
    return {
        "python -c pass (peer)": [sys.executable, "-c", "pass"],
        "hpcsec --help": [*HPCSEC, "--help"],
        "hpcsec rules list": [*HPCSEC, "rules", "list"],
        "hpcsec config check": [*HPCSEC, "config", "check", config],
        "hpcsec slurm prolog": [
            *HPCSEC,
            "slurm",
            "prolog",
            "--state-dir",
            state_dir,
            "--host-name",
            "n1",
        ],
        "hpcsec slurm epilog": [
            *HPCSEC,
            "slurm",
            "epilog",
            "--state-dir",
            state_dir,
            "--host-name",
            "n1",
        ],
        "hpcsec alerts --help": [*HPCSEC, "alerts", "--help"],
    }


# What slurmd sets for a Prolog=: the hook records a job start as it would on a node (it may
# also ask scontrol, when Slurm answers here).
HOOK_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "bench"}


def measure(argv: list[str], cache_dir: str) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of one run of argv."""
    env = {**os.environ, **HOOK_ENV, "XDG_CACHE_HOME": cache_dir}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped here
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.startup", description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as state_dir, tempfile.TemporaryDirectory() as cache:
        peer = None
        print(bytecode_line())
        print(f"{'command':26} {'CPU s':>7} {'x peer':>7} {'RSS MB':>7} {'1st run':>8}")
        for name, cmd in commands(state_dir).items():
            first = measure(cmd, cache)[0]
            runs = [measure(cmd, cache) for _ in range(args.repeat)]
            cpu = statistics.median(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            peer = cpu if peer is None else peer
            mark = "" if "peer" in name or cpu <= TARGET_CPU_S else "  > target"
            print(f"{name:26} {cpu:7.3f} {cpu / peer:7.1f} {rss:7.1f} {first:8.3f}{mark}")
        print(f"target: <= {TARGET_CPU_S} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
