"""CEF bodies byte for byte: header and extension escaping, the BOM of a UTF-8 body."""

from __future__ import annotations

from hpcsec.detector.outputs.cef import CEF_PRODUCT_VERSION
from hpcsec.detector.outputs.rfc5424 import format_message


def test_cef_message_byte_for_byte():
    alert = {
        "alert.id": "id1",
        "@timestamp": "2026-11-30T01:00:00Z",
        "rule.id": "r|1",
        "rule.title": "line\r\nbreak \\ and = sign",
        "rule.level": "informational",
        "host.name": "gpu-003",
        "process.name": "a=b\\c\rd",
        "count": 2,
    }
    message = format_message(alert, body_format="cef", hostname="h", procid=9)
    assert message == (
        b'<86>1 2026-11-30T01:00:00.000Z h hpcsec 9 r|1 [hpcsec@32473 id="id1" rule="r|1" '
        b'level="informational" host="gpu-003" count="2"] '
        b"CEF:0|hpcsec|hpcsec|"
        + CEF_PRODUCT_VERSION.encode()
        + b"|r\\|1|line break \\\\ and = sign|1|"
        b"rt=1796000400000 externalId=id1 dvchost=gpu-003 dproc=a\\=b\\\\c\\rd cnt=2"
    )
    utf8 = format_message(
        {**alert, "user.name": "jürgen"}, body_format="cef", hostname="h", procid=9
    )
    body = utf8.split(b"] ", 1)[1]
    assert body.startswith(b"\xef\xbb\xbfCEF:0|")  # the UTF-8 BOM
    assert "duser=jürgen".encode() in body
