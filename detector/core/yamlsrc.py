"""YAML documents that remember their line numbers.

PyYAML's composer keeps a mark on every node; we build plain Python values from the nodes and
keep, next to them, the line of every key and list item. Rules and the site config use this so
that every error names a file and a line. Aliases are refused (no Sigma rule or config needs
them, and they are how "billion laughs" documents blow up), duplicate keys are errors rather
than PyYAML's silent last-one-wins, and the size of a file is bounded before it is parsed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from hpcsec.detector.core.errors import SourceError, location
from hpcsec.detector.core.yamldoc import Path_
from hpcsec.detector.core.yamldoc import YamlDocument as YamlDocument  # its public home

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_NODES = 200_000

PLAIN_COLLECTION_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _AliasSeen(Exception):
    """The fast path met a node twice: an alias, which the pure-Python path reports."""


STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"


class _Builder:
    def __init__(self, source: str, refuse_repeats: bool = False):
        self.source = source
        self.constructor = yaml.constructor.SafeConstructor()
        self.lines: dict[Path_, int] = {}
        self.count = 0
        # libyaml's composer resolves an alias to the anchored node itself: a node met twice
        self.seen: set[int] | None = set() if refuse_repeats else None

    def _visit(self, node: yaml.Node) -> int:
        """Count `node` (bounded), refuse one met before; its line."""
        if self.seen is not None:
            if id(node) in self.seen:
                raise _AliasSeen
            self.seen.add(id(node))
        self.count += 1
        if self.count > MAX_NODES:
            raise SourceError(
                f"document has more than {MAX_NODES} nodes",
                location(self.source, node.start_mark.line + 1),
            )
        return node.start_mark.line + 1

    def build(self, node: yaml.Node, at: Path_) -> Any:
        line = self.lines[at] = self._visit(node)
        kind = type(node)
        if kind is yaml.ScalarNode:
            # a plain string is the node's text (what SafeConstructor would return), without
            # the constructor's dispatch: most of the nodes of a rule file
            if node.tag == STR_TAG:
                return node.value
            return self.constructor.construct_object(node, deep=True)
        if node.tag not in PLAIN_COLLECTION_TAGS:
            # mappings and lists are built here, not by PyYAML's constructor: refuse the tags
            # (`!!set`, `!!python/object/apply:…`) rather than silently read a plain list
            raise SourceError(f"YAML tag {node.tag} is not supported", location(self.source, line))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, at)
        return [self.build(item, (*at, i)) for i, item in enumerate(node.value)]

    def _mapping(self, node: yaml.MappingNode, at: Path_) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                raise SourceError(
                    "YAML merge keys (<<) are not supported",
                    location(self.source, key_node.start_mark.line + 1),
                )
            if type(key_node) is yaml.ScalarNode and key_node.tag == STR_TAG:
                key_line = self._visit(key_node)
                key: Any = key_node.value
            else:
                key = self.build(key_node, (*at, "<key>"))
                key_line = key_node.start_mark.line + 1
            if isinstance(key, (list, dict)):
                raise SourceError("a mapping key must be a scalar", location(self.source, key_line))
            if key in out:
                raise SourceError(f"duplicate key {key!r}", location(self.source, key_line))
            out[key] = self.build(value_node, (*at, key))
            self.lines[(*at, key)] = key_line
        self.lines.pop((*at, "<key>"), None)
        return out


class _NoAliasComposer(yaml.SafeLoader):
    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise SourceError(
                "YAML aliases (*name) are not allowed",
                location(self.name, event.start_mark.line + 1),
            )
        return super().compose_node(parent, index)


def decode_source(raw: bytes, source: str) -> str:
    if len(raw) > MAX_FILE_BYTES:
        raise SourceError(f"file is larger than {MAX_FILE_BYTES} bytes", location(source))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SourceError(
            f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}", location(source, line)
        ) from None


def _fast_documents(text: str, source: str) -> list[YamlDocument] | None:
    """All documents composed by libyaml (C), or None when the text is anything but plain valid
    YAML without aliases: then the pure-Python path runs, and its errors are the ones users see.

    The pure-Python composer is most of the time `hpcsec rules list` and the agent's start spend
    on the bundled rules; libyaml gives the same nodes with the same marks, about ten times
    faster, and bounds nesting at 1000 levels itself.
    """
    loader_class = getattr(yaml, "CSafeLoader", None)
    if loader_class is None:  # PyYAML built without libyaml
        return None
    loader = loader_class(text)
    docs = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            builder = _Builder(source, refuse_repeats=True)
            data = builder.build(node, ())
            docs.append(YamlDocument(data, source, node.start_mark.line + 1, builder.lines))
    except (yaml.YAMLError, SourceError, _AliasSeen, RecursionError, ValueError):
        return None
    finally:
        loader.dispose()
    return docs


def iter_documents(text: str, source: str) -> Iterator[YamlDocument]:
    fast = _fast_documents(text, source)
    if fast is not None:
        return iter(fast)
    return python_documents(text, source)


def python_documents(text: str, source: str) -> Iterator[YamlDocument]:
    """PyYAML's pure-Python composer: aliases refused where they stand, every error placed."""
    try:
        # the reader checks every character of a str when it is built: a raw ESC or NUL in a
        # rule file is an error in that file at its line, not a crash
        loader = _NoAliasComposer(text)
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, source) from None
    loader.name = source
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            builder = _Builder(source)
            data = builder.build(node, ())
            yield YamlDocument(data, source, node.start_mark.line + 1, builder.lines)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        if "\t" in problem or "'\\t'" in problem:
            problem = "tab character where YAML expects spaces"
        raise SourceError(f"YAML syntax error: {problem}", location(source, line, column)) from None
    except yaml.YAMLError as exc:
        raise SourceError(f"YAML error: {exc}", location(source)) from None
    except RecursionError:
        line = loader.get_mark().line + 1 if loader.get_mark() else None
        raise SourceError("YAML nesting is too deep", location(source, line)) from None
    finally:
        loader.dispose()


def _reader_error(exc: yaml.reader.ReaderError, text: str, source: str) -> SourceError:
    """A character YAML does not allow, named by its code (never written raw) and placed."""
    before = text[: exc.position]
    line = before.count("\n") + 1
    column = exc.position - (before.rfind("\n") + 1) + 1
    return SourceError(
        f"YAML syntax error: character U+{exc.character:04X} is not allowed in YAML",
        location(source, line, column),
    )


def load_documents(path: str | Path) -> list[YamlDocument]:
    """All documents of a YAML file, with lines; SourceError on anything unreadable."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror}", location(source)) from None
    return list(iter_documents(decode_source(raw, source), source))


def load_text_documents(text: str, source: str = "<string>") -> list[YamlDocument]:
    return list(iter_documents(text, source))
