"""Node strings as event text: one lossless, visible form for bytes that are not UTF-8.

Linux names, paths, command lines and environments are bytes, and the node's users choose
them. Python hands a name that is not UTF-8 back with lone surrogates (`surrogateescape`):
lossless, but no JSON encoder, terminal or SIEM accepts them, so one such name used to make
`event_id` raise and cost a whole sample its events. Every string read from the node is
therefore turned, at the sensor, into one visible form: valid UTF-8 stays as it is and each
byte that is not becomes the four characters `\\xNN` (an executable named b"\\xffsl" is
`\\xffsl`). The form is deterministic, so a replay gives the same events and ids. A name that
contains a literal backslash followed by `xNN` reads the same as the byte: the analyst sees
what `ls -b` would show, which is what is needed to find the file.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: see core/schema.py
if TYPE_CHECKING:
    from typing import Any

_INT_MAX = 2**63 - 1
# Events are flat; a list field holds scalars. Deeper nesting (only a hostile JSONL line has
# it) is cut here, so the id of any event can be computed: orjson refuses 255 levels.
MAX_DEPTH = 32
TOO_DEEP = f"(nested deeper than {MAX_DEPTH} levels)"


def from_node_bytes(data: bytes) -> str:
    """`data` (a name, path, argument or value read from the node) as event text."""
    return data.decode("utf-8", "backslashreplace")


def escape_surrogates(text: str) -> str:
    """`text` from an OS call that decodes with `surrogateescape` (os.readlink, os.listdir,
    os.fsdecode, a raw input) in the form `from_node_bytes` gives its bytes."""
    if text.isascii():  # the usual case, at C speed
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the bytes the OS handed us
    except UnicodeEncodeError:  # a surrogate that came from no byte (a JSON \\ud800 escape)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return from_node_bytes(raw)


def escape_value(value: Any, depth: int = 0) -> Any:
    """`value` with every string (keys too) escaped, every integer too wide for JSON
    readers made a string and containers below MAX_DEPTH replaced by TOO_DEEP: what an
    event may hold whatever a sensor or a file handed us."""
    if isinstance(value, str):
        return escape_surrogates(value)
    if isinstance(value, dict | list | tuple) and depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {escape_surrogates(str(k)): escape_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape_value(v, depth + 1) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _INT_MAX:
        return str(value)
    return value
