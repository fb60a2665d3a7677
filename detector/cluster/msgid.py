"""A node's `Nats-Msg-Id`s: an HMAC of each message's own id under a random key of the node's.

JetStream drops a message whose `Nats-Msg-Id` it has seen within the stream's duplicate
window, whichever node published it. An id any node can compute (the SHA-256 of an event
body with second timestamps and known pids, an alert id that hashes the rule and its window)
let a compromised node publish another node's message first and have the real one dropped as
a duplicate. Keyed by a secret of the node, an id is the same for the same message on that
node (a retry after a lost ack, or after a restart, is stored once) and cannot be guessed
anywhere else.

The key is 32 random bytes in `nats-message-id.key` of the node's spool directory, which
`hpcsec agent --nats` and `hpcsec publish` share: a node has one key. The directory is made
0700 (or refused, as the spool refuses it: private_fs.py), the file 0600. A key file that is
a symlink, not a regular file, not ours, or open to others is refused with a clear error:
only root or we can put one in that directory, and a key others could read may have leaked.
One of the wrong size (damaged) is replaced by a fresh key.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.core.private_fs import PrivatePathError, make_private_dir, open_private_new

MESSAGE_KEY = "nats-message-id.key"
KEY_BYTES = 32


class MessageKeyError(HpcsecError):
    """The node's message-id key cannot be kept or read safely."""


def message_id(key: bytes, ident: str) -> str:
    """The `Nats-Msg-Id` of the message whose own id is `ident` (see the module's doc)."""
    return hmac.new(key, ident.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[:32]


def random_key() -> bytes:
    """A key for this process alone, where none can be kept: its own retries are still
    stored once, a retry by a later run may be stored twice (nothing is lost)."""
    return secrets.token_bytes(KEY_BYTES)


def message_key(directory: Path) -> bytes:
    """The node's key kept in `directory` (created 0700 if missing), made on first use."""
    try:
        make_private_dir(directory)
    except PrivatePathError as exc:
        raise MessageKeyError(f"cannot keep the NATS message-id key: {exc.message}") from None
    path = Path(directory) / MESSAGE_KEY
    key = _read_key(path)
    if key is None:
        try:
            return _install_new_key(path, os.link)
        except FileExistsError:  # another process made it meanwhile: take theirs
            key = _read_key(path)
    if key is None or len(key) != KEY_BYTES:
        key = _install_new_key(path, os.replace)
    return key


def _read_key(path: Path) -> bytes | None:
    """The key file's bytes, None when there is none; a file we cannot trust is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise MessageKeyError(_refusal(path, str(reason))) from None
    with os.fdopen(fd, "rb") as f:
        problem = _untrusted(os.fstat(f.fileno()))
        if problem:
            raise MessageKeyError(_refusal(path, problem))
        try:
            return f.read(KEY_BYTES + 1)
        except OSError as exc:
            raise MessageKeyError(_refusal(path, str(exc.strerror))) from None


def _untrusted(info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid != os.geteuid():
        return f"it belongs to uid {info.st_uid}, not to us"
    if info.st_mode & 0o077:
        return f"others may read or change it (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _refusal(path: Path, reason: str) -> str:
    return f"refusing the NATS message-id key {path}: {reason}; remove it and a new key is made"


def _install_new_key(path: Path, install: Callable[[str, str], None]) -> bytes:
    """A fresh key, written in full to a private temporary file and then put at `path` by
    `install`: os.link where nothing is there (FileExistsError when another process was
    first), os.replace over a damaged key. Either way no reader sees it half written."""
    key = random_key()
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    try:
        with os.fdopen(open_private_new(temporary), "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise MessageKeyError(_cannot_write(path, exc)) from None
    try:
        install(str(temporary), str(path))
    except FileExistsError:
        raise
    except OSError as exc:
        raise MessageKeyError(_cannot_write(path, exc)) from None
    finally:
        with contextlib.suppress(OSError):  # gone already after os.replace
            os.unlink(temporary)
    return key


def _cannot_write(path: Path, exc: OSError) -> str:
    return f"cannot write the NATS message-id key {path}: {exc.strerror}"
