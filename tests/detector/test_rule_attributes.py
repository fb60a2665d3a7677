"""`alert_identity:` is checked by `rules check`: a malformed value is an error on its line,
not a silent fallback to the default identity."""

from __future__ import annotations

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.engine.lint import check_paths

RULE = """\
title: Weights read by a copy tool
id: 0f4c9b5e-9a77-4a43-9f0b-0f5a2b1c3d4e
status: test
description: test rule
level: high
tags: [attack.exfiltration]
logsource: {{product: hpc, category: file_access}}
detection:
  sel:
    process.name: scp
  condition: sel
{identity}
"""

CORRELATION = """
---
title: Many copies
id: 5d0c7c1e-2f4b-4a8e-9d3c-1b2a3c4d5e6f
status: test
description: test correlation
level: high
tags: [attack.exfiltration]
correlation:
  type: event_count
  rules: [0f4c9b5e-9a77-4a43-9f0b-0f5a2b1c3d4e]
  group-by: [host.name]
  timespan: 5m
  condition: {gte: 3}
alert_identity: [file.path]
"""


def _identity_errors(tmp_path, identity, extra=""):
    path = tmp_path / "model_theft.yml"
    path.write_text(RULE.format(identity=identity) + extra)
    return [
        (f.line, f.message)
        for f in check_paths([path])
        if f.code == "alert-identity" and f.severity == "error"
    ]


@pytest.mark.parametrize(
    "identity, line, message",
    [
        ("alert_identity: file.path", 12, "must be a list of event field names, not str"),
        ("alert_identity: {file.path: 1}", 12, "must be a list of event field names, not dict"),
        ("alert_identity:\n  - file.path\n  - file.pathh", 14, "unknown field 'file.pathh'"),
        ("alert_identity: [file.path, 3]", 12, "alert_identity[1] must be a field name, not 3"),
        ("alert_identity: ['']", 12, "alert_identity[0] must be a field name, not ''"),
    ],
)
def test_malformed_identity_is_an_error_on_its_line(tmp_path, identity, line, message):
    ((found_line, found),) = _identity_errors(tmp_path, identity)
    assert found_line == line and message in found


@pytest.mark.parametrize("identity", ["", "alert_identity: []", "alert_identity: [file.path]"])
def test_well_formed_or_absent_identity_is_fine(tmp_path, identity):
    assert _identity_errors(tmp_path, identity) == []


def test_identity_on_a_correlation_is_an_error(tmp_path):
    ((line, message),) = _identity_errors(tmp_path, "", CORRELATION)
    assert line == 27 and "detection rules only" in message


def test_rules_check_fails_on_it(tmp_path, capsys):
    path = tmp_path / "model_theft.yml"
    path.write_text(RULE.format(identity="alert_identity: [no.such.field]"))
    assert main(["rules", "check", str(path)]) != 0
    assert f"{path}:12: error:" in capsys.readouterr().out
