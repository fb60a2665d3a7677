"""`python -m bench [NAME [ARGS...]]`: run one benchmark by name with its own options, or all of
them in turn with their defaults."""

from __future__ import annotations

import importlib
import sys

# name -> module under bench/ with a `main(argv) -> int`
BENCHES = {
    "engine": "bench.engine",
    "scan": "bench.scan",
    "sensors": "bench.sensors",
    "file_access": "bench.file_access",
    "agent": "bench.agent",
    "outputs": "bench.outputs",
    "regex": "bench.regex",
    "startup": "bench.startup",
    "sigmahq": "bench.sigmahq",
    "rule_load": "bench.rule_load",
    "cluster": "bench.cluster",
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\nbenchmarks: " + ", ".join(BENCHES))
        return 0
    if argv:
        name, rest = argv[0], argv[1:]
        if name not in BENCHES:
            print(f"unknown benchmark {name!r}; known: {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        return importlib.import_module(BENCHES[name]).main(rest)
    status = 0
    for name, module in BENCHES.items():
        print(f"== {name}", flush=True)
        status |= importlib.import_module(module).main([])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
