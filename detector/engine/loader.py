"""Sigma rule files -> RuleSet: the files named, then the rule cache's entry for them
(rulecache.py) or, on a miss, their parse (coldload.py: YAML, pySigma, duplicates,
correlation references, test events).

The cold path is imported on a miss only: pySigma's parser (pyparsing grammars) and PyYAML
cost more start-up than `hpcsec rules list` or `config check` may take with a warm cache."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hpcsec.rules
from hpcsec.detector.core.errors import RuleError, UsageError, location
from hpcsec.detector.engine import crossfile, rulecache
from hpcsec.detector.engine.ruleset import BUNDLED, RuleSet

if TYPE_CHECKING:  # the config parser is not imported by `rules list`, which has no config
    from hpcsec.detector.config.site import SiteConfig
    from hpcsec.detector.engine.coldpool import Workers

RULE_SUFFIXES = (".yml", ".yaml")
TESTS_DIR = "tests"  # beside the rule files: their test events, not rules


def bundled_rules_dir() -> Path:
    """The rules/ directory shipped inside the installed package (found from its __init__:
    importlib.resources costs `rules list` more start-up than the rest of this module)."""
    return Path(hpcsec.rules.__file__ or "").parent


def _files_under(path: Path, errors: list[RuleError]) -> list[Path]:
    """The rule files `path` names: itself, or a directory's *.yml/*.yaml, recursively,
    minus tests/ and hidden directories (symlinked directories are not entered)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        errors.append(RuleError("no such file or directory", location(path)))
        return []
    found: list[tuple[tuple[str, ...], str]] = []
    _walk(str(path), found)
    if not found:
        errors.append(RuleError("no rule files (*.yml, *.yaml) in this directory", location(path)))
    return [Path(file) for _, file in sorted(found)]


def _walk(root: str, found: list[tuple[tuple[str, ...], str]]) -> None:
    """os.scandir, not Path.rglob and a stat per file: listing SigmaHQ's 3,754 files is a
    good part of a cached load. Sorted by path parts, as Paths sort, by the caller. Its own
    stack, not recursion: a rule directory nested deeper than Python's recursion limit is a
    rule directory like another (`rules check` of a tree someone else wrote)."""
    stack: list[tuple[str, tuple[str, ...]]] = [(root, ())]
    while stack:
        directory, parts = stack.pop()
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
        except OSError:  # unreadable: skipped, as rglob does
            continue
        for entry in listed:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != TESTS_DIR and not entry.name.startswith("."):
                    stack.append((entry.path, (*parts, entry.name)))
            elif os.path.splitext(entry.name)[1] in RULE_SUFFIXES and entry.is_file():
                found.append(((*parts, entry.name), entry.path))


def _identity(file: Path) -> tuple[int, int] | str:
    """What makes two names one file: its device and inode (a symlink, a hard link or
    another spelling of the path), else its absolute path."""
    try:
        info = os.stat(file)
    except OSError:
        return os.path.abspath(file)
    return info.st_dev, info.st_ino


def rule_sources(paths: Sequence[str | Path], errors: list[RuleError]) -> dict[Path, str]:
    """Each rule file named by `paths`, with its origin: `bundled` for the rules shipped with
    hpcsec, else the path given. A file named twice (as itself, in its directory, or by the
    site config and the command line) loads once, with the origin that named it first."""
    bundled = bundled_rules_dir().resolve()
    sources: dict[tuple[int, int] | str, tuple[Path, str]] = {}
    for given in paths:
        origin = BUNDLED if Path(given).resolve() == bundled else str(given)
        for file in _files_under(Path(given), errors):
            sources.setdefault(_identity(file), (file, origin))
    return dict(sources.values())


def rule_paths_for(
    config: SiteConfig | None, rule_paths: Sequence[str] | None, *, default_rules: bool = True
) -> list[str]:
    """The rules a pipeline runs, in load order: the bundled ones (unless `default_rules` is
    off), then the config's `rules:`, then the command line's `--rules`. Local rules add to
    the bundled ones, as a local rules file does in Falco: their filters apply to bundled
    rules, and a local rule reusing a bundled rule's id is an error."""
    paths = [str(bundled_rules_dir())] if default_rules else []
    paths += [*(config.rule_paths if config is not None else ()), *(rule_paths or ())]
    if not paths:
        raise UsageError("--no-default-rules needs rules: --rules PATH or `rules:` in the config")
    return paths


def load_rules(
    paths: Sequence[str | Path] | None = None,
    *,
    collect_errors: bool = False,
    with_tests: bool = True,
    threshold_values: Mapping[str, Any] | None = None,
    cache: Path | None = None,
) -> RuleSet:
    """Rules (and their test events) from files and directories; None = the bundled rules.

    Raises the first RuleError, or with `collect_errors` returns every error in `.errors` next
    to the rules that did load. `with_tests=False` skips the test events: what scanning needs,
    so a slip in a tests file does not stop detection. `cache`: a directory where what each
    rule file gave is kept by content hash (rulecache.py): only the files that changed are
    parsed, and the rules come back lazy (ruleset.LoadedRule).
    """
    ruleset = RuleSet()
    roots = [bundled_rules_dir()] if paths is None else paths
    sources = rule_sources(roots, ruleset.errors)
    if ruleset.errors and not collect_errors:
        raise ruleset.errors[0]
    if cache is None or not _load_through_cache(ruleset, sources, roots, threshold_values, cache):
        # on a cache miss only (see the module's docstring), the workers first: they import
        # the parser while this process does
        from hpcsec.detector.engine.coldpool import start_workers, stopped_on_error

        workers = start_workers(len(sources))
        with stopped_on_error(workers):  # from here on, parse_files owns the workers
            from hpcsec.detector.engine.coldload import parse_files

        parse_files(ruleset, sources, threshold_values, with_tests, workers)
    elif with_tests:
        from hpcsec.detector.engine.ruletests import load_tests_for

        for path in sources:
            load_tests_for(path, ruleset)
    if ruleset.errors and not collect_errors:
        raise ruleset.errors[0]
    return ruleset


def _load_through_cache(
    ruleset: RuleSet,
    sources: Mapping[Path, str],
    roots: Sequence[str | Path],
    threshold_values: Mapping[str, Any] | None,
    directory: Path,
) -> bool:
    """Add the rules of `sources` (the files under `roots`) from their entries in the pack of
    `roots`, parsing only the files without one and then rewriting the pack, then run the
    checks across files (crossfile.py); False when the cache cannot be used (not private,
    code unreadable) and nothing was added."""
    fingerprint = rulecache.fingerprint()
    with rulecache.CacheDir(directory, create=True) as cache:
        if fingerprint is None or cache.fd is None:
            return False
        name = rulecache.pack_name(roots)
        pack = cache.read_pack(name)
        workers: Workers | None = None
        guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if not pack:
            # an empty pack: every file is a miss, so the workers (if so many files call for
            # them) start now, before the files are read and keyed (a tenth of a second of
            # SigmaHQ's cold load)
            from hpcsec.detector.engine.coldpool import start_workers, stopped_on_error

            workers = start_workers(len(sources))
            guard = stopped_on_error(workers)
        with guard:  # until in_parallel owns the workers
            found, datas = _read_through_pack(
                cache, name, pack, sources, fingerprint, threshold_values, workers
            )
    references = _assemble(ruleset, sources, found, datas, threshold_values)
    crossfile.drop_duplicate_ids(ruleset, references)
    referable = crossfile.Referable.of(ruleset)  # one for both: see drop_cycles
    crossfile.check_references(ruleset, references, referable)
    crossfile.drop_cycles(ruleset, references, referable)
    return True


def _read_through_pack(
    cache: rulecache.CacheDir,
    name: str,
    pack: Mapping[str, bytes | memoryview],
    sources: Mapping[Path, str],
    fingerprint: bytes,
    threshold_values: Mapping[str, Any] | None,
    workers: Workers | None,
) -> tuple[dict[Path, rulecache.FileEntry | None], dict[Path, bytes | None]]:
    """Each file's entry (None where it has none, to parse as it is) and bytes: read from
    `pack` where its key is there, else parsed (in `workers` when given: started for an
    empty pack, whose files are all missing; else in workers started when enough files are
    missing); the pack rewritten when anything was added."""
    keys: dict[Path, str | None] = {}
    datas: dict[Path, bytes | None] = {}
    found: dict[Path, rulecache.FileEntry | None] = {}
    stored: dict[str, bytes | memoryview] = {}  # the entries the pack will hold
    added = 0  # of them, entries made by this load
    for path in sources:
        data = datas[path] = rulecache.read_file(path)
        key = keys[path] = (
            None if data is None else rulecache.file_key(fingerprint, path, data, threshold_values)
        )
        entry = pack.get(key) if key is not None else None
        found[path] = rulecache.decode_stored(entry) if entry is not None else None
        if found[path] is not None and key is not None and entry is not None:
            stored[key] = entry
    missing = [path for path in sources if found[path] is None]
    if missing:
        # on a miss only (see the module's docstring), the workers first (as above)
        from hpcsec.detector.engine.coldpool import start_workers, stopped_on_error

        if workers is None:
            workers = start_workers(len(missing))
        with stopped_on_error(workers):  # from here on, in_parallel owns the workers
            from hpcsec.detector.engine.coldload import in_parallel, parse_entry_here

        def store(
            path: Path, entry: bytes | None, decoded: rulecache.FileEntry | None
        ) -> rulecache.FileEntry | None:
            nonlocal added
            key = keys[path]
            if entry is not None and key is not None:
                stored[key] = entry
                added += 1
            return decoded

        parsed = in_parallel(
            [(p, datas[p]) for p in missing],
            threshold_values,
            lambda path, data: store(path, *parse_entry_here(path, data, threshold_values)),
            lambda path, _, entry: store(
                path, entry, rulecache.decode_entry(entry) if entry is not None else None
            ),
            workers,
        )
        found.update(zip(missing, parsed, strict=True))
    # entries of files changed or no longer loaded, the latest first: a few are kept, as a
    # change may be undone. A file that gives no entry (unreadable, or a rule that cannot be
    # pickled) is parsed at every load, without writing the pack every time.
    gone = [key for key in pack if key not in stored]
    if added or len(gone) > rulecache.SPARE_ENTRIES:
        stored.update((key, pack[key]) for key in gone[: rulecache.SPARE_ENTRIES])
        cache.write_pack(name, stored)
        cache.prune(name)
    else:
        cache.touch(name)
    return found, datas


def _assemble(
    ruleset: RuleSet,
    sources: Mapping[Path, str],
    found: Mapping[Path, rulecache.FileEntry | None],
    datas: Mapping[Path, bytes | None],
    threshold_values: Mapping[str, Any] | None,
) -> list[rulecache.References]:
    """The files' rules and errors in file order, as one serial parse would give them."""
    references: list[rulecache.References] = []
    for path, origin in sources.items():
        entry = found[path]
        if entry is None:  # unreadable, or a rule that cannot be pickled: parsed as is
            from hpcsec.detector.engine.coldload import add_entry

            references += add_entry(ruleset, path, origin, None, threshold_values)
            continue
        for rule in entry.ruleset.rules:
            rule.origin = origin
        ruleset.files.append(str(path))
        ruleset.rules += entry.ruleset.rules
        ruleset.errors += entry.ruleset.errors
        references += entry.references
    return references
