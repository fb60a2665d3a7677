"""Sigma collection actions: the documents of one file with `action: global`, `reset` and
`repeat` applied the way pySigma's SigmaCollection applies them, each key keeping its line."""

from __future__ import annotations

import copy
from collections.abc import Iterable

from sigma.collection import deep_dict_update

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.yamlsrc import YamlDocument


def merged(base: YamlDocument, over: YamlDocument, line: int) -> YamlDocument:
    """`over` deep-merged onto `base` (Sigma collection actions), keeping each key's own line."""
    data = deep_dict_update(copy.deepcopy(base.data), copy.deepcopy(over.data))
    data.pop("action", None)
    return YamlDocument(data, over.path, line, {**base.lines, **over.lines, (): line})


def rule_documents(docs: Iterable[YamlDocument]) -> tuple[list[YamlDocument], list[RuleError]]:
    """The rule documents of a file, with `action: global/reset/repeat` applied as pySigma does."""
    out: list[YamlDocument] = []
    errors: list[RuleError] = []
    global_doc: YamlDocument | None = None
    previous: YamlDocument | None = None
    for doc in docs:
        if doc.data is None:  # empty document, e.g. after a trailing `---`
            continue
        if not isinstance(doc.data, dict):
            errors.append(
                RuleError(
                    f"a Sigma document must be a mapping, not a {type(doc.data).__name__}",
                    location(doc.path, doc.line),
                )
            )
            continue
        action = doc.data.get("action")
        if action is None:
            if global_doc is not None and not {"correlation", "filter"} & doc.data.keys():
                doc = merged(doc, global_doc, doc.line)  # the global part wins, as in pySigma
            out.append(doc)
            previous = doc
        elif action == "global":
            global_doc = merged(YamlDocument({}, doc.path, doc.line), doc, doc.line)
            previous = global_doc
        elif action == "reset":
            global_doc = None
        elif action == "repeat":
            if previous is None:
                errors.append(
                    RuleError(
                        "`action: repeat` without a rule before it",
                        location(doc.path, doc.line_of("action")),
                    )
                )
                continue
            previous = merged(previous, doc, doc.line)
            out.append(previous)
        else:
            errors.append(
                RuleError(
                    f"unknown Sigma collection action {action!r} "
                    "(expected global, reset or repeat)",
                    location(doc.path, doc.line_of("action")),
                )
            )
    return out, errors
