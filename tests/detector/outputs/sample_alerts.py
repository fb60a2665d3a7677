"""The alert the syslog tests send: every field the message header, the structured data and
CEF map, with values that need escaping."""

from __future__ import annotations


def make_alert(marker: str, n: int, level: str = "high", **fields) -> dict:
    return {
        "alert.id": f"{marker}-{n}",
        "@timestamp": "2026-11-30T01:02:03.456Z",
        "rule.id": "6f1d2c3b-0a9e-4c1d-8e7f-112233445566",
        "rule.title": "Model weights read by a copy tool",
        "rule.level": level,
        "rule.tags": ["attack.exfiltration", "attack.t1005"],
        "rule.vector": "model_theft",
        "host.name": "gpu-017",
        "slurm.job.id": "4242",
        "user.name": 'eve "x"]\\',
        "process.pid": 31337,
        "process.name": "rclone",
        "count": 3,
        "events": [{"event.id": "e1", "file.path": "/lustre/models/llama/w.bin"}],
        "alert.first_seen": "2026-11-30T01:02:03.456Z",
        "alert.last_seen": "2026-11-30T01:04:00.000Z",
        "alert.summary": f"alert {n}: rclone read llama weights",
        **fields,
    }


SD_EXPECTED = (
    '[hpcsec@32473 id="{id}" rule="6f1d2c3b-0a9e-4c1d-8e7f-112233445566" '
    'level="{level}" vector="model_theft" host="gpu-017" job="4242" '
    'user="eve \\"x\\"\\]\\\\" count="3"]'
)
