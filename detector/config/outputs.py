"""Where alerts go and which ones are held back: output URLs and silences."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hpcsec.detector.config.reader import ConfigReader
from hpcsec.detector.core.display import redacted_url

OUTPUT_SCHEMES = (
    "syslog+udp",
    "syslog+tcp",
    "syslog+tls",
    "http",
    "https",
    "splunk+http",
    "splunk+https",
    "elasticsearch+http",
    "elasticsearch+https",
    "file",
)
# An `outputs:` item is a URL, or a mapping with the URL and what that output alone needs.
OUTPUT_ENTRY_KEYS = ("url", "headers", "token_file", "sign")
SILENCE_MATCHERS = ("rule_id", "host", "job", "user")


@dataclass(frozen=True)
class Silence:
    """Alerts matching every given matcher are stored, not sent, until `expires`."""

    rule_id: str | None = None
    host: str | None = None
    job: str | None = None
    user: str | None = None
    expires: datetime | None = None
    comment: str = ""

    def matches(self, alert: dict[str, Any], now: datetime) -> bool:
        if self.expires is not None and now >= self.expires:
            return False
        checks = (
            (self.rule_id, "rule.id"),
            (self.host, "host.name"),
            (self.job, "slurm.job.id"),
            (self.user, "user.name"),
        )
        return all(
            want is None or fnmatch.fnmatchcase(str(alert.get(key, "")), want)
            for want, key in checks
        )


@dataclass(frozen=True)
class OutputSettings:
    """What one output entry sets besides its URL (docs/integrations.md): HTTP headers, each a
    value or `{file: PATH}`; the file of a Splunk HEC token or Elasticsearch API key; whether
    a webhook signs its requests."""

    url: str
    headers: Mapping[str, str | Mapping[str, str]] = field(default_factory=dict)
    token_file: str | None = None
    sign: bool | None = None


def _output_url(r: ConfigReader, item: Any, i: int) -> str:
    if isinstance(item, dict):
        entry = r.mapping(item, "outputs", i, allowed=OUTPUT_ENTRY_KEYS)
        item = entry.get("url")
        if not isinstance(item, str):
            raise r.fail("an output entry needs `url:` (a string)", "outputs", i)
    elif not isinstance(item, str):
        raise r.fail("outputs must be a list of URLs or entries with `url:`", "outputs", i)
    return item


def parse_output_urls(r: ConfigReader, value: Any) -> tuple[str, ...]:
    """The shape of each output URL, checked here so an error names its line; the output
    itself (secrets, certificates, ports) is checked when it is opened."""
    items = [value] if isinstance(value, str) else r.items(value, "outputs")
    urls = tuple(_output_url(r, item, i) for i, item in enumerate(items))
    for i, url in enumerate(urls):
        if url == "-":
            continue
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in OUTPUT_SCHEMES or not rest.strip("/"):
            raise r.fail(
                f"output {redacted_url(url)!r} is not one of: syslog+udp|tcp|tls://HOST:PORT, "
                "http(s)://…, splunk+https://HOST:PORT, elasticsearch+https://HOST:PORT/INDEX, "
                "file:///PATH.jsonl, -",
                "outputs",
                i,
            )
    return urls


def _headers(r: ConfigReader, value: Any, i: int) -> dict[str, str | Mapping[str, str]]:
    headers: dict[str, str | Mapping[str, str]] = {}
    for name, spec in r.mapping(value, "outputs", i, "headers").items():
        if isinstance(spec, dict):
            f = r.mapping(spec, "outputs", i, "headers", name, allowed=("file",))
            if not isinstance(f.get("file"), str):
                raise r.fail("a header from a file is {file: PATH}", "outputs", i, "headers", name)
            headers[str(name)] = {"file": f["file"]}
        elif isinstance(spec, str):
            headers[str(name)] = spec
        else:
            raise r.fail(
                "a header value is a string or {file: PATH}", "outputs", i, "headers", name
            )
    return headers


def parse_output_settings(r: ConfigReader, value: Any) -> tuple[OutputSettings, ...]:
    """The entries of `outputs:` that are mappings (run after parse_output_urls)."""
    settings = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        if not isinstance(item, dict):
            continue
        token_file, sign = item.get("token_file"), item.get("sign")
        if token_file is not None and not isinstance(token_file, str):
            raise r.fail("token_file must be a path", "outputs", i, "token_file")
        if sign is not None and not isinstance(sign, bool):
            raise r.fail("sign must be true or false", "outputs", i, "sign")
        settings.append(
            OutputSettings(item["url"], _headers(r, item.get("headers"), i), token_file, sign)
        )
    return tuple(settings)


def parse_silences(r: ConfigReader, value: Any) -> tuple[Silence, ...]:
    silences = []
    for i, item in enumerate(r.items(value, "silences")):
        s = r.mapping(item, "silences", i, allowed=(*SILENCE_MATCHERS, "expires", "comment"))
        if not any(s.get(k) for k in SILENCE_MATCHERS):
            raise r.fail(
                "a silence needs at least one matcher (rule_id, host, job, user)", "silences", i
            )
        rule_id, host, job, user = (
            str(s[k]) if s.get(k) is not None else None for k in SILENCE_MATCHERS
        )
        expires = r.time(s["expires"], "silences", i, "expires") if s.get("expires") else None
        silences.append(
            Silence(
                rule_id,
                host,
                job,
                user,
                expires=expires,
                comment=str(s.get("comment", "")),
            )
        )
    return tuple(silences)
