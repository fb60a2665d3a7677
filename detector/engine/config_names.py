"""Site config names checked against the loaded rules: a misspelled name is an error.

`lists: {miner_name: [...]}` (for `miner_names`) or `thresholds: {weight_files_10m: 8}` would
otherwise be accepted and change nothing: the rule keeps its default and the site believes
it is tuned. So a list or threshold that no loaded rule uses (and, for lists, that the
enrichment does not read) is an error at its line, naming the closest known name.

A list a rule compares with `process.name` alone can never match an entry longer than 15
characters there: that field is the kernel's `comm`, cut at 15. Such an entry is an error too;
the fix is to match `process.executable_name` as well in that rule (the bundled rules do) or
to shorten the entry.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.errors import ConfigError, location
from hpcsec.detector.engine import thresholds
from hpcsec.detector.engine.ruleset import LoadedRule

# Lists the enrichment reads itself (detector/enrich/policy.py), whatever the rules.
POLICY_LISTS = frozenset({"ld_preload_allowed"})
COMM_MAX = 15
COMM_FIELDS = frozenset({"process.name", "process.parent.name"})


def _closest(name: str, known: Collection[str]) -> str:
    import difflib  # only for an error: a valid config's check does not import it

    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _error(config: SiteConfig, key: str, message: str) -> ConfigError:
    return ConfigError(message, location(config.path, config.name_lines.get(key)))


def config_name_errors(config: SiteConfig, rules: Sequence[LoadedRule]) -> list[ConfigError]:
    """Unknown `lists:`/`thresholds:` names and list entries that can never match."""
    fields: dict[str, set[str]] = {}
    comm_only: dict[str, set[str]] = {}  # lists some rule compares with comm fields alone
    for rule in rules:  # from the headers: a cached rule set is checked without pySigma
        for name, used_on in rule.header.placeholder_fields.items():
            fields.setdefault(name, set()).update(used_on)
            if used_on and set(used_on) <= COMM_FIELDS:
                comm_only.setdefault(name, set()).update(used_on)
    errors: list[ConfigError] = []
    known_lists = set(fields) | POLICY_LISTS
    for name in config.lists:
        if name not in known_lists:
            errors.append(
                _error(
                    config,
                    f"lists.{name}",
                    f"lists.{name} is not used by any loaded rule{_closest(name, known_lists)}",
                )
            )
        elif name in comm_only:
            errors.extend(_comm_errors(config, name, comm_only[name]))
    unused = thresholds.unused(config.thresholds, rules)
    known_thresholds = _threshold_names(rules)
    for name in unused:
        errors.append(
            _error(
                config,
                f"thresholds.{name}",
                f"thresholds.{name} is not used by any loaded rule"
                f"{_closest(name, known_thresholds)}",
            )
        )
    return errors


def _comm_errors(config: SiteConfig, name: str, used_on: set[str]) -> Iterator[ConfigError]:
    for entry in config.lists[name]:
        if len(entry.encode()) > COMM_MAX and "*" not in entry:
            yield _error(
                config,
                f"lists.{name}",
                f"lists.{name}: {entry!r} can never match: a rule compares this list with "
                f"{', '.join(sorted(used_on))} alone, the kernel's name cut at {COMM_MAX} "
                f"characters ({entry[:COMM_MAX]!r})",
            )


def _threshold_names(rules: Sequence[LoadedRule]) -> set[str]:
    return {name for rule in rules for name in thresholds.names_used(rule)}
