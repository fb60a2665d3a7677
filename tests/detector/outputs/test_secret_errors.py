"""Error texts that could carry an output URL's secrets: a webhook's transport error and a
syslog URL's configuration errors show no path token, query token or userinfo."""

from __future__ import annotations

import httpx
import pytest

from hpcsec.detector.outputs.httpauth import transport_failure
from hpcsec.detector.outputs.protocol import DeliveryFailed, OutputError, redact
from hpcsec.detector.outputs.registry import open_outputs
from hpcsec.detector.outputs.webhook import WebhookOutput
from tests.ports import refusing_port

PATH_TOKEN = "T000/B000/XXXXpathTOKEN"
QUERY_TOKEN = "QUERYsecret"
URL = f"https://user:PASSWORDx@hooks.example/services/{PATH_TOKEN}?token={QUERY_TOKEN}"
SECRETS = (PATH_TOKEN, QUERY_TOKEN, "PASSWORDx", "services")


@pytest.mark.parametrize(
    "message",
    [
        f"cannot connect to {URL}",
        f"POST /services/{PATH_TOKEN}?token={QUERY_TOKEN} failed",
        f"POST /services/{PATH_TOKEN} failed",  # the path without its query
        f"bad query token={QUERY_TOKEN}",
        "proxy refused user:PASSWORDx",
    ],
)
def test_transport_error_text_is_redacted(message):
    failure = transport_failure(httpx.ConnectError(message), URL, redact(URL))
    for secret in SECRETS:
        assert secret not in str(failure)
    assert str(failure).startswith("ConnectError: ")


def test_a_real_connection_failure_names_only_the_redacted_url():
    url = f"http://user:PASSWORDx@127.0.0.1:{refusing_port()}/services/{PATH_TOKEN}?token={QUERY_TOKEN}"
    output = WebhookOutput(url, b"s3cret", timeout_s=2)
    try:
        with pytest.raises(DeliveryFailed) as caught:
            output.send({"alert.id": "a1", "rule.title": "t"})  # type: ignore[arg-type]
    finally:
        output.close()
    for secret in SECRETS:
        assert secret not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "syslog+udp://user:PASSWORDx@host:port?token=QUERYsecret",
        "syslog+tcp://user:PASSWORDx@host:514/services?token=QUERYsecret",
        "syslog+tcp://user:PASSWORDx@host:514?format=xml&token=QUERYsecret",
        "syslog+tcp://user:PASSWORDx@host:514?facility=mail2&x=QUERYsecret",
        "syslog+tcp://user:PASSWORDx@host:514?max_bytes=QUERYsecret",
        "syslog+udp://user:PASSWORDx@host:514?ca=QUERYsecret",
    ],
)
def test_syslog_url_errors_show_no_userinfo_or_query(url):
    with pytest.raises(OutputError) as caught:
        open_outputs([url])
    text = str(caught.value)
    assert redact(url) in text
    for secret in ("PASSWORDx", "QUERYsecret", "services"):
        assert secret not in text
