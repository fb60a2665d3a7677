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
# Collections nested deeper than this are an error (no rule or config comes near): the
# pure-Python path recurses, and both paths must refuse the same documents.
MAX_DEPTH = 100

PLAIN_COLLECTION_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"


class _Builder:
    def __init__(self, source: str):
        self.source = source
        self.constructor = yaml.constructor.SafeConstructor()
        self.lines: dict[Path_, int] = {}
        self.count = 0

    def _visit(self, node: yaml.Node) -> int:
        """Count `node` (bounded); its line."""
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
                return self._text(node.value, line)
            return self._construct(node, line)
        if node.tag not in PLAIN_COLLECTION_TAGS:
            # mappings and lists are built here, not by PyYAML's constructor: refuse the tags
            # (`!!set`, `!!python/object/apply:…`) rather than silently read a plain list
            raise SourceError(f"YAML tag {node.tag} is not supported", location(self.source, line))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, at)
        return [self.build(item, (*at, i)) for i, item in enumerate(node.value)]

    def _text(self, value: str, line: int) -> str:
        """A string, refused when an escape (`"\\ud800"`) made it hold a lone surrogate: no
        event text holds one, and no query or output can carry one (it is not UTF-8)."""
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                # a pair written as two escapes (`"\\ud83d\\ude00"`), which PyYAML leaves
                # apart, is the one character it stands for; a surrogate alone is an error
                lone = _lone_surrogate(value)
                if lone is not None:
                    raise SourceError(
                        f"YAML text holds a lone surrogate (\\u{ord(lone):04x}), which is not "
                        "Unicode text",
                        location(self.source, line),
                    ) from None
                return value.encode("utf-16", "surrogatepass").decode("utf-16")
        return value

    def _construct(self, node: yaml.Node, line: int) -> Any:
        """A scalar of another type than string (a number, a date…), or the error at its
        line: PyYAML's constructors raise what they meet (`!!bool maybe`: KeyError)."""
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise  # placed by python_documents
        except Exception:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise SourceError(
                f"YAML value is not a valid {tag}", location(self.source, line)
            ) from None

    def _mapping(self, node: yaml.MappingNode, at: Path_) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == MERGE_TAG:
                raise SourceError(
                    "YAML merge keys (<<) are not supported", location(self.source, key_line)
                )
            if type(key_node) is not yaml.ScalarNode:
                raise SourceError("a mapping key must be a scalar", location(self.source, key_line))
            self._visit(key_node)
            key: Any = (
                self._text(key_node.value, key_line)
                if key_node.tag == STR_TAG
                else self._construct(key_node, key_line)
            )
            if key in out:
                raise SourceError(f"duplicate key {key!r}", location(self.source, key_line))
            out[key] = self.build(value_node, (*at, key))
            self.lines[(*at, key)] = key_line
        return out


def _lone_surrogate(text: str) -> str | None:
    """The first surrogate of `text` that is not half of a high-low pair, if any."""
    i = 0
    while i < len(text):
        c = text[i]
        if "\ud800" <= c <= "\udbff" and i + 1 < len(text) and "\udc00" <= text[i + 1] <= "\udfff":
            i += 2
            continue
        if "\ud800" <= c <= "\udfff":
            return c
        i += 1
    return None


class _NoAliasComposer(yaml.SafeLoader):
    depth = 0  # of the node being composed (the document's root: 1)

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            raise SourceError(
                "YAML aliases (*name) are not allowed",
                location(self.name, event.start_mark.line + 1),
            )
        if self.depth > MAX_DEPTH:  # refused here, where the composer would recurse on
            raise SourceError(
                "YAML nesting is too deep", location(self.name, event.start_mark.line + 1)
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


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
    """All documents built from libyaml's (C) event stream, or None when the text is anything
    but plain valid YAML without aliases: then the pure-Python path runs, and its errors are
    the ones users see.

    The pure-Python composer is most of the time `hpcsec rules list` and the agent's start spend
    on the bundled rules; libyaml parses about ten times faster and bounds nesting at 1000
    levels itself. Values are built from its events (_EventBuilder), not from the nodes its
    composer would make of them: the nodes, and the Python resolver call the composer makes
    for each, were half of a SigmaHQ file's YAML time.
    """
    loader_class = getattr(yaml, "CSafeLoader", None)
    # libyaml takes a tab as a space in places PyYAML's scanner refuses it: such a text is
    # the Python path's to accept or refuse, whichever PyYAML is installed
    if loader_class is None or "\t" in text:  # (None: PyYAML built without libyaml)
        return None
    try:
        loader = loader_class(text)  # (a lone surrogate cannot be encoded for libyaml)
    except Exception:
        return None
    try:
        return _EventBuilder(loader).documents(source)
    except Exception:  # _NotPlain, libyaml's errors, or a value its constructor refuses
        # (`!!bool maybe`): met before a syntax error later in the text, which the Python
        # path (composing the whole document first) reports first, as it should
        return None
    finally:
        loader.dispose()


class _NotPlain(Exception):
    """What the event builder leaves to the pure-Python path: an alias, a repeated anchor or
    key, a merge key, a collection key, an unsupported tag, too many nodes, too deep."""


_MAPPING_START, _SCALAR = yaml.MappingStartEvent, yaml.ScalarEvent
_ENDS = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class _EventBuilder:
    """Plain values and their lines from a CSafeLoader's events, as _Builder makes them from
    nodes (same values, same lines, same bounds): an explicit stack, no recursion."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.constructor = yaml.constructor.SafeConstructor()
        self.resolve = yaml.resolver.Resolver().resolve
        # implicit resolvers by the first character of a plain scalar: a plain scalar whose
        # first character has none is a string, without the resolver's call
        self.implicit_by_first = yaml.resolver.Resolver.yaml_implicit_resolvers

    def _tag(self, event: Any) -> str:
        tag = event.tag
        if tag is not None and tag != "!":
            return str(tag)
        value = event.value
        if not event.implicit[0] or (value and value[0] not in self.implicit_by_first):
            return STR_TAG  # what resolve() returns for these (no path resolvers)
        tag = _PLAIN_TAGS.get(value)
        if tag is None:
            tag = str(self.resolve(yaml.ScalarNode, value, event.implicit))
            if len(value) <= 64 and len(_PLAIN_TAGS) < MAX_PLAIN_TAGS:
                _PLAIN_TAGS[value] = tag
        return tag

    def documents(self, source: str) -> list[YamlDocument]:
        loader, docs = self.loader, []
        loader.get_event()  # StreamStart
        while not loader.check_event(yaml.StreamEndEvent):
            loader.get_event()  # DocumentStart
            line = loader.peek_event().start_mark.line + 1
            lines: dict[Path_, int] = {}
            data = self._document(lines)
            loader.get_event()  # DocumentEnd
            docs.append(YamlDocument(data, source, line, lines))
        return docs

    def _scalar(self, event: Any) -> Any:
        tag = self._tag(event)
        if tag == STR_TAG:
            return event.value
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        return self.constructor.construct_object(node, deep=True)

    def _document(self, lines: dict[Path_, int]) -> Any:
        get_event = self.loader.get_event
        anchors: set[str] = set()
        count = 0
        # open collections: [value, path, is_mapping, key waiting for its value, its line,
        # whether it is a flow collection ([…], {…}) or in one]
        stack: list[list[Any]] = []
        root: Any = None
        while True:
            event = get_event()
            kind = type(event)
            if kind in _ENDS:
                value = stack.pop()[0]
                if not stack:
                    return value
                continue
            if kind is yaml.AliasEvent:
                raise _NotPlain
            if event.anchor is not None:
                if event.anchor in anchors:
                    raise _NotPlain
                anchors.add(event.anchor)
            count += 1
            if count > MAX_NODES:
                raise _NotPlain
            line = event.start_mark.line + 1
            top = stack[-1] if stack else None
            if (
                kind is _SCALAR
                and top is not None
                and top[5]
                and not event.style  # plain
                and "?" in event.value
            ):
                raise _NotPlain  # PyYAML ends a plain scalar at `?` in a flow collection
            if top is not None and top[2] and top[3] is _NO_KEY:
                # a mapping's key
                if kind is not _SCALAR:
                    raise _NotPlain
                # a merge key (<<) has no constructor: an error, left to the Python path
                key = self._scalar(event)
                if key in top[0]:
                    raise _NotPlain
                top[3], top[4] = key, line
                continue
            if len(stack) > MAX_DEPTH:
                raise _NotPlain
            if top is None:
                at: Path_ = ()
            elif top[2]:
                at = (*top[1], top[3])
            else:
                at = (*top[1], len(top[0]))
            lines[at] = line
            if kind is _SCALAR:
                value = self._scalar(event)
            else:
                is_mapping = kind is _MAPPING_START
                tag = event.tag
                if tag is None or tag == "!":
                    tag = self.resolve(
                        yaml.MappingNode if is_mapping else yaml.SequenceNode, None, event.implicit
                    )
                if tag not in PLAIN_COLLECTION_TAGS:
                    raise _NotPlain
                value = {} if is_mapping else []
            if top is None:
                root = value
            elif top[2]:
                top[0][top[3]] = value
                lines[at] = top[4]
                top[3] = _NO_KEY
            else:
                top[0].append(value)
            if kind is not _SCALAR:
                flow = bool(event.flow_style) or (top is not None and top[5])
                stack.append([value, at, kind is _MAPPING_START, _NO_KEY, 0, flow])
            elif top is None:
                return root


_NO_KEY = object()  # a mapping waiting for its next key
# the tags of short plain scalars resolved so far (keys, levels, `true`…), bounded: a plain
# scalar's tag depends on its text alone
_PLAIN_TAGS: dict[str, str] = {}
MAX_PLAIN_TAGS = 4096


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
