"""Named thresholds: declared in the rule, replaced from the site config at load time."""

import pytest

from hpcsec.detector.core.yamlsrc import load_text_documents
from hpcsec.detector.engine import thresholds

RULE = """\
title: READ surge
thresholds:
  read_requests_per_s: [detection, selection, "rdma.per_s.hw.rx_read_requests|gte"]
  errors_per_minute: [correlation, condition, gte]
detection:
  selection:
    rdma.per_s.hw.rx_read_requests|gte: 200000
  condition: selection
correlation:
  condition:
    gte: 60
"""


def _doc(text=RULE):
    (doc,) = load_text_documents(text, "r.yml")
    return doc


def test_declared_paths_point_at_numbers():
    paths, errors = thresholds.declared(_doc())
    assert errors == []
    assert paths == {
        "read_requests_per_s": ("detection", "selection", "rdma.per_s.hw.rx_read_requests|gte"),
        "errors_per_minute": ("correlation", "condition", "gte"),
    }


def test_config_values_replace_the_defaults():
    doc = _doc()
    assert thresholds.apply(doc, {"read_requests_per_s": 5e5, "unrelated": 3}) == []
    assert doc.data["detection"]["selection"]["rdma.per_s.hw.rx_read_requests|gte"] == 5e5
    assert doc.data["correlation"]["condition"]["gte"] == 60  # not in the config: default


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        (
            "  bad: [detection, nothing]\n",
            "r.yml:4: threshold 'bad': ['detection', 'nothing'] points at nothing, not a number",
        ),
        (
            "  bad: [detection, condition]\n",
            "r.yml:4: threshold 'bad': ['detection', 'condition'] "
            "points at 'selection', not a number",
        ),
        (
            "  bad: detection.selection\n",
            "r.yml:4: threshold 'bad': the path must be a list of "
            "keys, e.g. [detection, selection, 'field|gte']",
        ),
    ],
)
def test_malformed_declarations_name_the_line(declaration, message):
    text = RULE.replace("  errors_per_minute: [correlation, condition, gte]\n", declaration)
    _, errors = thresholds.declared(_doc(text))
    assert [str(e) for e in errors] == [message]


def test_a_config_value_that_is_not_a_number():
    errors = thresholds.apply(_doc(), {"errors_per_minute": "lots"})
    assert [str(e) for e in errors] == [
        "r.yml:11: threshold 'errors_per_minute': the config gives 'lots', not a number"
    ]


SURGE = """\
title: READ surge
id: 3f1c2b4a-5d6e-4f70-8a9b-0c1d2e3f4a5b
status: test
level: high
thresholds:
  rdma_read_requests_per_s: [detection, selection, "rdma.per_s.hw.rx_read_requests|gte"]
logsource: {product: hpc, category: rdma_counters}
detection:
  selection:
    rdma.per_s.hw.rx_read_requests|gte: 200000
  condition: selection
"""


def _surge_event(rate):
    return {
        "@timestamp": "2026-11-30T01:00:00Z",
        "event.category": "rdma_counters",
        "host.name": "gpu-017",
        "rdma.device": "mlx5_1",
        "rdma.per_s.hw.rx_read_requests": rate,
    }


def test_the_site_config_tunes_a_rule_through_scan(tmp_path, capsys):
    import json

    from hpcsec.detector.cli.main import main

    rules = tmp_path / "rdma_abuse.yml"
    rules.write_text(SURGE)
    events = tmp_path / "e.jsonl"
    events.write_text(json.dumps(_surge_event(300000)) + "\n")
    config = tmp_path / "site.yml"
    assert main(["scan", "--events", str(events), "--no-default-rules", "--rules", str(rules)]) == 1
    config.write_text("thresholds: {rdma_read_requests_per_s: 500000}\n")
    assert (
        main(
            [
                "scan",
                "--events",
                str(events),
                "--no-default-rules",
                "--rules",
                str(rules),
                "--config",
                str(config),
            ]
        )
        == 0
    )
    config.write_text("thresholds: {rdma_read_requests_per_s: 250000}\n")
    assert (
        main(
            [
                "scan",
                "--events",
                str(events),
                "--no-default-rules",
                "--rules",
                str(rules),
                "--config",
                str(config),
            ]
        )
        == 1
    )
    capsys.readouterr()


def test_rules_check_reports_a_broken_declaration(tmp_path, capsys):
    from hpcsec.detector.cli.main import main

    rules = tmp_path / "rdma_abuse.yml"
    rules.write_text(
        SURGE.replace('"rdma.per_s.hw.rx_read_requests|gte"]', '"rdma.per_s.hw.rx_read_requests"]')
    )
    assert main(["rules", "check", str(rules)]) == 2
    out = capsys.readouterr()
    err = out.out + out.err
    assert f"{rules}:6: error: threshold 'rdma_read_requests_per_s'" in err
    assert "points at nothing, not a number" in err


def test_bundled_rules_declare_the_documented_thresholds():
    from pathlib import Path

    from hpcsec.detector.core.yamlsrc import load_documents
    from hpcsec.detector.engine.loader import bundled_rules_dir

    names = set()
    for path in sorted(Path(bundled_rules_dir()).glob("*.yml")):
        for doc in load_documents(path):
            paths, errors = thresholds.declared(doc)
            assert errors == []
            names |= set(paths)
    docs = (Path(__file__).parents[2] / "docs" / "rules.md").read_text()
    assert names >= {
        "rkey_errors_per_minute",
        "rdma_read_requests_per_s",
        "weight_files_per_user_10m",
        "dataset_modifications_per_5m",
    }
    for name in names:
        assert f"`{name}`" in docs, f"docs/rules.md does not list threshold {name}"


def test_scan_refuses_a_threshold_no_rule_knows(tmp_path, capsys):
    import json

    from hpcsec.detector.cli.main import main

    rules = tmp_path / "rdma_abuse.yml"
    rules.write_text(SURGE)
    events = tmp_path / "e.jsonl"
    events.write_text(json.dumps(_surge_event(1)) + "\n")
    config = tmp_path / "site.yml"
    config.write_text("thresholds: {rdma_read_request_per_s: 5, rdma_read_requests_per_s: 9}\n")
    argv = ["scan", "--events", str(events), "--no-default-rules", "--rules", str(rules)]
    code = main([*argv, "--config", str(config)])
    assert code == 2
    assert capsys.readouterr().err == (
        f"hpcsec: error: {config}:1: thresholds.rdma_read_request_per_s is not used by any "
        "loaded rule (did you mean 'rdma_read_requests_per_s'?)\n"
    )
