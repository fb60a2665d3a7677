"""Credentials the HTTP outputs send (webhook headers, Splunk HEC tokens, Elasticsearch API keys)
and the client they send them with.

A credential lives in a file that only its owner may read: one that group or others can read is
a leaked credential, a warning for a one-off scan and an error for the agent (`must_be_private`),
as for the webhook signing secret.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx

from hpcsec.detector.core.log import get_logger
from hpcsec.detector.outputs.protocol import DeliveryFailed, OutputError, redact

logger = get_logger(__name__)
# Header values are sent as they are: a newline in one would start a header of its own.
_FORBIDDEN_IN_HEADER = frozenset("\r\n\0")


def read_private_file(path: str, what: str, must_be_private: bool = False) -> bytes:
    """The stripped contents of `path`, a file holding `what` (e.g. "webhook secret")."""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            content = fh.read().strip()
    except OSError as exc:
        raise OutputError(f"cannot read {what} file {path}: {exc.strerror}") from None
    if mode & 0o077:
        problem = (
            f"{what} file {path} is readable by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it"
        )
        if must_be_private:
            raise OutputError(problem)
        logger.warning("%s", problem)
    if not content:
        raise OutputError(f"{what} file {path} is empty")
    return content


def header_value(name: str, value: bytes | str, where: str) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if not name or any(c in _FORBIDDEN_IN_HEADER or c == ":" for c in name):
        raise OutputError(f"{where}: bad header name {name!r}")
    if any(c in _FORBIDDEN_IN_HEADER for c in text):
        raise OutputError(f"{where}: header {name} has a line break or NUL in its value")
    return text


def resolve_headers(
    headers: Mapping[str, str | Mapping[str, str]], where: str, must_be_private: bool
) -> dict[str, str]:
    """Header name -> value; a value given as `{file: PATH}` is read from that private file."""
    out = {}
    for name, spec in headers.items():
        if isinstance(spec, Mapping):
            raw: bytes | str = read_private_file(spec["file"], f"{name} header", must_be_private)
        else:
            raw = spec
        out[name] = header_value(name, raw, where)
    return out


def http_client(timeout_s: float, user_agent: str) -> httpx.Client:
    return httpx.Client(
        timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
        follow_redirects=False,
        headers={"User-Agent": user_agent},
    )


def check_http_url(url: str, kind: str, expected: str) -> None:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise OutputError(f"{kind} output {redact(url)!r}: bad port") from None
    if not parts.hostname or parts.fragment:
        raise OutputError(f"{kind} output {redact(url)!r}: expected {expected}")


def transport_failure(exc: httpx.TransportError, url: str, name: str) -> DeliveryFailed:
    """A connection error, its message without the URL's path and query (they may hold tokens)."""
    message = f"{type(exc).__name__}: {exc}"
    parts = urlsplit(url)
    # longest first, so a part of a longer secret is not left behind by a shorter one
    secrets = (
        url,
        parts.path + ("?" + parts.query if parts.query else ""),
        parts.path,
        parts.query,
        parts.netloc.rpartition("@")[0] if "@" in parts.netloc else "",
    )
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) > 1:
            message = message.replace(secret, name)
    return DeliveryFailed(message)
