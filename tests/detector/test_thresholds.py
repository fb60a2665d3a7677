"""Named thresholds: declared in the rule, replaced from the site config at load time."""

import pytest

from hpcsec.detector import thresholds
from hpcsec.detector.yamlsrc import load_text_documents

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
        "errors_per_minute": ("correlation", "condition", "gte")}


def test_config_values_replace_the_defaults():
    doc = _doc()
    assert thresholds.apply(doc, {"read_requests_per_s": 5e5, "unrelated": 3}) == []
    assert doc.data["detection"]["selection"]["rdma.per_s.hw.rx_read_requests|gte"] == 5e5
    assert doc.data["correlation"]["condition"]["gte"] == 60  # not in the config: default


@pytest.mark.parametrize(("declaration", "message"), [
    ("  bad: [detection, nothing]\n", "r.yml:4: threshold 'bad': ['detection', 'nothing'] "
     "points at nothing, not a number"),
    ("  bad: [detection, condition]\n", "r.yml:4: threshold 'bad': ['detection', 'condition'] "
     "points at 'selection', not a number"),
    ("  bad: detection.selection\n", "r.yml:4: threshold 'bad': the path must be a list of "
     "keys, e.g. [detection, selection, 'field|gte']"),
])
def test_malformed_declarations_name_the_line(declaration, message):
    text = RULE.replace('  errors_per_minute: [correlation, condition, gte]\n', declaration)
    _, errors = thresholds.declared(_doc(text))
    assert [str(e) for e in errors] == [message]


def test_a_config_value_that_is_not_a_number():
    errors = thresholds.apply(_doc(), {"errors_per_minute": "lots"})
    assert [str(e) for e in errors] == [
        "r.yml:11: threshold 'errors_per_minute': the config gives 'lots', not a number"]
