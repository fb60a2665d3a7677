"""Where alerts go and which ones are held back: output URLs and silences."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hpcsec.detector.config.reader import ConfigReader
from hpcsec.detector.core.display import redacted_url

OUTPUT_SCHEMES = ("syslog+udp", "syslog+tcp", "syslog+tls", "http", "https", "file")
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


def parse_output_urls(r: ConfigReader, value: Any) -> tuple[str, ...]:
    """The shape of each output URL, checked here so an error names its line; the output
    itself (secrets, certificates, ports) is checked when it is opened."""
    urls = r.strings(value, "outputs")
    for i, url in enumerate(urls):
        if url == "-":
            continue
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in OUTPUT_SCHEMES or not rest.strip("/"):
            raise r.fail(
                f"output {redacted_url(url)!r} is not one of: syslog+udp|tcp|tls://HOST:PORT, "
                "http(s)://…, file:///PATH.jsonl, -",
                "outputs",
                i,
            )
    return urls


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
