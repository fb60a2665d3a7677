"""The cold path of loader.load_rules: each rule file's documents (collection.py) parsed by
pySigma with errors at their line (parse.py), duplicates dropped, correlation references
resolved across files, and the test events beside them (ruletests.py).

A file parses alone into what the rule cache keeps of it (`parse_entry`: its rules, lazy,
and its errors; rulecache.py), so many files parse in worker processes (`in_parallel`) and
come back in file order: the errors are those of one process reading the files in turn. The
caller parses a share of the files itself, into rules (or the entries to write), and takes in
the workers' entries as they come.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hpcsec.detector.core.errors import HpcsecError, RuleError, location
from hpcsec.detector.core.yamlsrc import decode_source, iter_documents, load_documents
from hpcsec.detector.engine import correlation_rules, crossfile, rulecache, ruletests, thresholds
from hpcsec.detector.engine.coldpool import PARALLEL_MIN_FILES, Workers, start_workers
from hpcsec.detector.engine.collection import rule_documents
from hpcsec.detector.engine.memory import gc_paused
from hpcsec.detector.engine.parse import parse_document
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

GROUP_FILES = 25  # files per task handed to a worker; the caller takes tasks from the end
T = TypeVar("T")


@gc_paused()
def parse_files(
    ruleset: RuleSet,
    sources: Mapping[Path, str],
    threshold_values: Mapping[str, Any] | None,
    with_tests: bool,
    workers: Workers | None = None,
) -> None:
    """Add the rules of `sources` (file -> origin) to `ruleset`, errors to ruleset.errors
    (`workers`: coldpool.start_workers's for these files, if started already)."""
    if workers is None and len(sources) < PARALLEL_MIN_FILES:
        for path, origin in sources.items():
            load_file(path, ruleset, threshold_values, origin)
    else:
        # the caller's share is parsed into rules here, never pickled; a worker's entries are
        # unpickled as they arrive, so that this work counts in the caller's share
        parts = in_parallel(
            [(path, None) for path in sources],
            threshold_values,
            lambda path, _: _parsed_part(path, threshold_values),
            lambda path, _, entry: _received_part(path, entry, threshold_values),
            workers,
        )
        for origin, part in zip(sources.values(), parts, strict=True):
            for rule in part.rules:
                rule.origin = origin
            ruleset.files += part.files
            ruleset.rules += part.rules
            ruleset.errors += part.errors
    crossfile.drop_duplicate_ids(ruleset)
    referable = crossfile.Referable.of(ruleset)  # what resolve_correlations resolves against
    correlation_rules.resolve_correlations(ruleset)
    references = [correlation_rules.references_of(r) for r in ruleset.rules]
    crossfile.drop_cycles(ruleset, references, referable)
    for path in sources if with_tests else ():
        ruletests.load_tests_for(path, ruleset)


def _parsed_part(path: Path, threshold_values: Mapping[str, Any] | None) -> RuleSet:
    part = RuleSet()
    load_file(path, part, threshold_values)
    for rule in part.rules:
        rule.header  # noqa: B018  # made now, in the share balanced with the workers'
    return part


def _received_part(
    path: Path, entry: bytes | None, threshold_values: Mapping[str, Any] | None
) -> RuleSet:
    """A worker's entry as rules holding their pySigma objects, as parsed ones do; parsed here
    when the worker could not make one."""
    decoded = rulecache.decode_entry(entry) if entry is not None else None
    if decoded is None:
        return _parsed_part(path, threshold_values)
    rules = decoded.ruleset.rules
    decoded.ruleset.rules = [
        LoadedRule(r.sigma, r.path, r.line, r.vector, r.key_lines) for r in rules
    ]
    return decoded.ruleset


def add_entry(
    ruleset: RuleSet,
    path: Path,
    origin: str,
    data: bytes | None,
    threshold_values: Mapping[str, Any] | None,
) -> list[rulecache.References]:
    """Add the rules and errors of one file's entry (`data`, from parse_entry) to `ruleset`;
    a file whose entry could not be made (None) is parsed here. Returns the rules'
    references (crossfile.py)."""
    entry = rulecache.decode_entry(data) if data is not None else None
    if entry is None:
        part = RuleSet()
        load_file(path, part, threshold_values, origin)
        references = [correlation_rules.references_of(r) for r in part.rules]
    else:
        part, references = entry.ruleset, entry.references
    for rule in part.rules:
        rule.origin = origin
    ruleset.files.append(str(path))
    ruleset.rules += part.rules
    ruleset.errors += part.errors
    return references


def load_file(
    path: Path,
    ruleset: RuleSet,
    threshold_values: Mapping[str, Any] | None = None,
    origin: str = "",
    data: bytes | None = None,
) -> None:
    """Add the rules of one file to `ruleset` (errors go to ruleset.errors).

    `threshold_values` (the site config's `thresholds`) replace the numbers the rules name
    in their `thresholds:` attribute, before pySigma sees them (detector/thresholds.py).
    `origin`: where the rules came from (`bundled` or the path given), for `rules list`.
    `data`: the file's bytes when already read (what the rule cache's key was made of).
    """
    ruleset.files.append(str(path))
    try:
        if data is None:
            docs, errors = rule_documents(load_documents(path))
        else:
            source = str(path)
            docs, errors = rule_documents(iter_documents(decode_source(data, source), source))
    except HpcsecError as exc:
        ruleset.errors.append(RuleError(exc.message, exc.location))
        return
    except RecursionError:  # PyYAML composes nested collections recursively
        ruleset.errors.append(RuleError("YAML is nested too deeply", location(path)))
        return
    ruleset.errors.extend(errors)
    if not docs and not errors:
        ruleset.errors.append(RuleError("no rules", location(path, 1)))
    for doc in docs:
        ruleset.errors.extend(thresholds.apply(doc, threshold_values or {}))
        item, errors = parse_document(doc)
        ruleset.errors.extend(errors)
        if item is not None:
            ruleset.rules.append(
                LoadedRule(item, str(path), doc.line, path.stem, doc.lines, origin)
            )


def parse_entry(
    path: Path, data: bytes | None, threshold_values: Mapping[str, Any] | None
) -> bytes | None:
    """One file parsed into a rule cache entry (rulecache.encode); None when a rule's object
    cannot be pickled (the caller then parses the file itself)."""
    return parse_entry_here(path, data, threshold_values)[0]


def parse_entry_here(
    path: Path, data: bytes | None, threshold_values: Mapping[str, Any] | None
) -> tuple[bytes, rulecache.FileEntry] | tuple[None, None]:
    """`parse_entry`, with the entry as rulecache.decode_entry would read it back, made
    without unpickling it again (0.17 ms a SigmaHQ file: bench rule_load --phases)."""
    part = RuleSet()
    load_file(path, part, threshold_values, "", data)
    try:
        return rulecache.encode_entry(
            part, [correlation_rules.references_of(r) for r in part.rules]
        )
    except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
        return None, None


@gc_paused()
def parse_group(
    items: Sequence[tuple[Path, bytes | None]], threshold_values: Mapping[str, Any] | None
) -> list[bytes | None]:
    """A worker's parse of one group of files (coldpool.serve): one entry per file."""
    return [parse_entry(path, data, threshold_values) for path, data in items]


@gc_paused()
def in_parallel(
    items: Sequence[tuple[Path, bytes | None]],
    threshold_values: Mapping[str, Any] | None,
    here: Callable[[Path, bytes | None], T],
    received: Callable[[Path, bytes | None, bytes | None], T],
    workers: Workers | None = None,
) -> list[T]:
    """One result per (path, bytes), in order: `here(path, data)` for the files the caller
    parses, `received(path, data, entry)` for the parse_entry a worker sent back.

    With enough files, worker processes (spawned: the caller may hold threads) take groups
    from the front while the caller parses groups from the end, until they meet; before each
    of its groups the caller takes in the entries the workers sent meanwhile, so that this
    work counts in its share and the two finish together (coldpool.py). A group a worker
    did not send back (it failed, or died) is parsed here. `workers`: those
    coldpool.start_workers started for these files (else started here), stopped here."""
    workers = workers if workers is not None else start_workers(len(items))
    if workers is None:
        return [here(path, data) for path, data in items]
    groups = [items[i : i + GROUP_FILES] for i in range(0, len(items), GROUP_FILES)]
    results: list[list[T] | None] = [None] * len(groups)

    def take_in(ready: Iterable[tuple[int, list[bytes | None] | None]]) -> None:
        for index, entries in ready:
            if 0 <= index < len(groups) and results[index] is None:
                results[index] = _take_in(groups[index], entries, here, received)

    try:
        if workers.claims.reset(len(groups)) and workers.send(items, threshold_values, GROUP_FILES):
            while (index := workers.claims.end()) is not None:
                take_in(workers.ready())  # what they sent so far: part of this one's share
                results[index] = [here(path, data) for path, data in groups[index]]
            take_in(workers.ready(wait=True))
    finally:
        workers.stop()
    return [
        one
        for index, result in enumerate(results)
        for one in (result if result is not None else [here(p, d) for p, d in groups[index]])
    ]


def _take_in(
    group: Sequence[tuple[Path, bytes | None]],
    entries: list[bytes | None] | None,
    here: Callable[[Path, bytes | None], T],
    received: Callable[[Path, bytes | None, bytes | None], T],
) -> list[T]:
    if not isinstance(entries, list) or len(entries) != len(group):  # the worker's parse failed
        return [here(path, data) for path, data in group]
    return [received(path, data, entry) for (path, data), entry in zip(group, entries, strict=True)]
