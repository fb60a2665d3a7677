"""Output URLs to outputs: which implementation serves which scheme, and `open_outputs`, the
one place the scan command and the agent get their OutputSet from.

Implementations are imported when a URL names them, so that a command that opens no network
output (`hpcsec alerts`) does not pay for httpx and ssl at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from hpcsec.detector.config.outputs import OutputSettings
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.outputs.delivery import OutputSet
from hpcsec.detector.outputs.protocol import Output, OutputError, OutputOptions, redact


def _stdout(url: str, options: OutputOptions) -> Output:
    from hpcsec.detector.outputs.stdout import StdoutOutput

    return StdoutOutput()


def _jsonl(url: str, options: OutputOptions) -> Output:
    from hpcsec.detector.outputs.jsonl import JsonlOutput

    return JsonlOutput.from_url(url)


def _syslog(url: str, options: OutputOptions) -> Output:
    from hpcsec.detector.outputs.syslog import SyslogOutput

    return SyslogOutput.from_url(url, options)


def _webhook(url: str, options: OutputOptions) -> Output:
    from hpcsec.detector.outputs.webhook import WebhookOutput

    return WebhookOutput.from_url(url, options)


def _splunk_hec(url: str, options: OutputOptions) -> Output:
    from hpcsec.detector.outputs.splunk_hec import SplunkHecOutput

    return SplunkHecOutput.from_url(url, options)


def _elasticsearch(url: str, options: OutputOptions) -> Output:
    from hpcsec.detector.outputs.elasticsearch import ElasticsearchOutput

    return ElasticsearchOutput.from_url(url, options)


Opener = Callable[[str, OutputOptions], Output]
OPENERS: dict[str, Opener] = {
    "file": _jsonl,
    "syslog+udp": _syslog,
    "syslog+tcp": _syslog,
    "syslog+tls": _syslog,
    "http": _webhook,
    "https": _webhook,
    "splunk+http": _splunk_hec,
    "splunk+https": _splunk_hec,
    "elasticsearch+http": _elasticsearch,
    "elasticsearch+https": _elasticsearch,
}
KNOWN = (
    "syslog+udp://, syslog+tcp://, syslog+tls://, http(s)://, splunk+https://, "
    "elasticsearch+https://, file:///….jsonl, -"
)


def open_output(url: str, options: OutputOptions) -> Output:
    """The output `url` names. Raises OutputError for an unknown type or a bad URL."""
    if not isinstance(url, str) or not url.strip():
        raise OutputError("empty output URL")
    url = url.strip()
    if url == "-":
        return _stdout(url, options)
    opener = OPENERS.get(urlsplit(url).scheme.lower())
    if opener is None:
        raise OutputError(f"unknown output type {redact(url)!r} (expected one of: {KNOWN})")
    return opener(url, options)


def default_spool_dir() -> str:
    if os.geteuid() == 0:
        return "/var/spool/hpcsec"
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return os.path.join(state, "hpcsec", "spool")


def _open_each(
    urls: list[str] | tuple[str, ...],
    options: OutputOptions,
    settings: tuple[OutputSettings, ...] = (),
) -> list[Output]:
    """Every output, each name once; on an error, those opened so far are closed again."""
    outputs: list[Output] = []
    seen: set[str] = set()
    by_url = {s.url: s for s in settings}
    try:
        for url in urls:
            entry = by_url.get(url)
            own = options
            if entry is not None:  # a config entry with `url:`: its headers, token, signing
                own = replace(
                    options, headers=entry.headers, token_file=entry.token_file, sign=entry.sign
                )
            out = open_output(url, own)
            if out.name in seen:
                raise OutputError(f"output {out.name!r} is given twice")
            seen.add(out.name)
            outputs.append(out)
    except BaseException:
        for out in outputs:
            out.close()
        raise
    return outputs


def open_outputs(
    urls: list[str] | tuple[str, ...],
    *,
    secret_file: str | None = None,
    spool_dir: str | None = None,
    config: SiteConfig | None = None,
    private_secret: bool = False,
) -> OutputSet:
    """Outputs for `urls` (command line first, else the config's `outputs`).

    Raises OutputError for an unknown type, a malformed URL, a missing or unreadable secret
    (with `private_secret`, also for a secret file that group or others can read);
    SpoolError when the spool cannot be used.
    """
    config = config or SiteConfig()
    options = OutputOptions(
        secret_file=secret_file or config.webhook_secret_file,
        secret_must_be_private=private_secret,
        syslog_format=config.syslog_format,
    )
    outputs = _open_each(urls or config.outputs, options, config.output_settings)
    durable = any(o.durable for o in outputs)
    spool = (spool_dir or config.spool_dir or default_spool_dir()) if durable else None
    return OutputSet(outputs, spool, config.spool_max_bytes)
