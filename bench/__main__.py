"""`python -m bench [NAME [ARGS...]]`: run one benchmark by name, or all of them in turn."""

from __future__ import annotations

import importlib
import sys

# name -> module under bench/ with a `main(argv) -> int`
BENCHES = {
    "engine": "bench.engine",
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\nbenchmarks: " + ", ".join(BENCHES))
        return 0
    if argv and not argv[0].startswith("-"):
        name, rest = argv[0], argv[1:]
        if name not in BENCHES:
            print(f"unknown benchmark {name!r}; known: {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        return importlib.import_module(BENCHES[name]).main(rest)
    status = 0
    for name, module in BENCHES.items():
        print(f"== {name}")
        status |= importlib.import_module(module).main(argv)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
