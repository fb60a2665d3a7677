"""A character YAML forbids (a raw ESC, NUL or DEL planted in a rule file) is a rule error at
its file, line and column, with exit 2: never an internal error, never the raw byte echoed."""

from __future__ import annotations

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.core.errors import RuleError, SourceError
from hpcsec.detector.core.yamlsrc import load_text_documents
from hpcsec.detector.engine.loader import load_rules

RULE = (
    "title: planted\n"
    "logsource: {product: hpc, category: process}\n"
    "detection:\n"
    "  sel:\n"
    "    process.name: xm{char}rig\n"
    "  condition: sel\n"
)

CHARS = {"esc": "\x1b", "nul": "\x00", "bel": "\x07", "c1-csi": "\x9b", "noncharacter": "\ufffe"}


@pytest.mark.parametrize("char", CHARS.values(), ids=CHARS.keys())
def test_yaml_reader_error_is_a_source_error_with_its_position(char):
    with pytest.raises(SourceError) as caught:
        load_text_documents(RULE.replace("{char}", char), "r.yml")
    assert str(caught.value) == (
        f"r.yml:5:21: YAML syntax error: character U+{ord(char):04X} is not allowed in YAML"
    )


@pytest.mark.parametrize("char", CHARS.values(), ids=CHARS.keys())
def test_rule_file_with_a_control_character_exits_2_with_file_and_line(tmp_path, char, capsys):
    path = tmp_path / "planted.yml"
    path.write_text(RULE.replace("{char}", char))
    with pytest.raises(RuleError) as caught:
        load_rules([path])
    assert (caught.value.location.path, caught.value.location.line) == (str(path), 5)
    assert main(["rules", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert f"{path}:5: error: YAML syntax error: character U+{ord(char):04X} is not" in out + err
    assert char not in out + err
