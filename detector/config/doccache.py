"""The parsed document of a site config, cached so that a command run again on the same file
(`config check`, `rules list --config`, the agent's start and reload) skips PyYAML: importing
it is most of what such a command would spend on the config.

An entry holds the document's value and the line of each of its parts (core/yamldoc.py), so
`parse_config` runs on it as on a fresh parse and every error it reports names the same file
and line. It is written only for a config that parsed and validated cleanly: a file with a
mistake is parsed again each time, by the parser whose errors users know.

The entry's name is a SHA-256 of the file's bytes, the code that parses them (core/yamlsrc.py,
core/yamldoc.py), PyYAML's and Python's versions: any change is another name, and the file's
path plays no part (the document takes the path it is read from). Entries live in the private
cache directory of the rule cache (core/cachedir.py: ours, 0700, opened with O_NOFOLLOW). The
entry repeats its own name and carries a SHA-256 of its contents, checked before use; it is
unpickled by an unpickler that builds nothing but plain values and datetimes, so even a forged
entry can run no code. An entry that is damaged or does not check is removed and the file is
parsed again.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
from pathlib import Path
from typing import Any

from hpcsec.detector.core import cachedir
from hpcsec.detector.core.yamldoc import YamlDocument

FORMAT = b"hpcsec-configcache-1"
_CORE = Path(__file__).resolve().parent.parent / "core"
# the code that turns the file's bytes into a document: a change to it must not read an old entry
PARSER_CODE = (_CORE / "yamlsrc.py", _CORE / "yamldoc.py")
# what YAML's safe constructor builds besides plain values: timestamps and dates
_ALLOWED_GLOBALS = frozenset(
    ("datetime", name) for name in ("datetime", "date", "timezone", "timedelta")
)


def default_dir() -> Path | None:
    """`<cache>/config`; None without a home directory to keep it in (nothing is cached)."""
    try:
        return cachedir.default_dir() / "config"
    except RuntimeError:  # no XDG_CACHE_HOME, no HOME and no passwd entry: Path.home() fails
        return None


def entry_name(raw: bytes) -> str | None:
    """The entry name for a config file's bytes; None when the parser's code cannot be read."""
    digest = hashlib.sha256(FORMAT)
    digest.update(f"PyYAML {cachedir.installed_version('PyYAML')}\n{sys.version}\n".encode())
    try:
        for code in PARSER_CODE:
            data = code.read_bytes()
            digest.update(f"\0{len(data)}\0".encode())
            digest.update(data)
    except OSError:
        return None
    digest.update(raw)
    return digest.hexdigest()


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain values and datetimes; any other class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not a plain value")
        return super().find_class(module, name)


def _plain_loads(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


def encode(name: str, doc: YamlDocument) -> bytes:
    payload = pickle.dumps((name, doc.data, doc.line, doc.lines), pickle.HIGHEST_PROTOCOL)
    digest = hashlib.sha256(payload).digest()
    return pickle.dumps((FORMAT, digest, payload), pickle.HIGHEST_PROTOCOL)


def decode(name: str, data: bytes, source: str) -> YamlDocument | None:
    """The document an entry holds, under the path `source`; None when the bytes are not an
    entry of this name (format, checksum, name or shape)."""
    outer = _plain_loads(data)
    if not (isinstance(outer, tuple) and len(outer) == 3 and outer[0] == FORMAT):
        return None
    _, digest, payload = outer
    # a checksum against damage, not a secret: a plain comparison will do
    if not isinstance(payload, bytes) or hashlib.sha256(payload).digest() != digest:
        return None
    inner = _plain_loads(payload)
    if not (isinstance(inner, tuple) and len(inner) == 4 and inner[0] == name):
        return None
    _, value, line, lines = inner
    if not (_is_line(line) and isinstance(lines, dict)):
        return None
    for keys, key_line in lines.items():
        if not (isinstance(keys, tuple) and all(isinstance(k, (str, int)) for k in keys)):
            return None
        if not _is_line(key_line):
            return None
    return YamlDocument(value, source, line, lines)


def _is_line(value: object) -> bool:
    return type(value) is int and value >= 1


def read(directory: Path, raw: bytes, source: str) -> YamlDocument | None:
    """The cached document of a config whose bytes are `raw`, else None (a miss)."""
    name = entry_name(raw)
    data = None if name is None else cachedir.read_entry(directory, name)
    if name is None or data is None:
        return None
    try:
        doc = decode(name, data, source)
    except Exception:  # any unpickling or shape error: a damaged or forged entry
        doc = None
    if doc is None:
        cachedir.remove_entry(directory, name)
    return doc


def write(directory: Path, raw: bytes, doc: YamlDocument) -> bool:
    """Keep the document of a config that parsed cleanly; False when it could not be kept
    (that only costs the next run its parse)."""
    name = entry_name(raw)
    if name is None:
        return False
    try:
        data = encode(name, doc)
    except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
        return False
    return cachedir.write_entry(directory, name, data)
