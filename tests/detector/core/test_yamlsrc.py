from pathlib import Path

import pytest

from hpcsec.detector.core.errors import SourceError
from hpcsec.detector.core.yamlsrc import decode_source, load_documents, load_text_documents


def test_documents_keep_lines_of_keys_and_items():
    docs = load_text_documents("a: 1\nb:\n  - x\n  - {c: 2}\n---\nz: [1, 2]\n", "f.yml")
    assert [d.data for d in docs] == [{"a": 1, "b": ["x", {"c": 2}]}, {"z": [1, 2]}]
    assert docs[0].line_of("b", 1, "c") == 4
    assert docs[0].line_of("b", 0) == 3
    assert docs[0].line_of("nope", "deeper") == 1
    assert docs[1].line == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &x [1]\nb: *x\n", "f.yml:2: YAML aliases (*name) are not allowed"),
        ("a: 1\na: 2\n", "f.yml:2: duplicate key 'a'"),
        ("a:\n\t- b\n", "f.yml:2:1: YAML syntax error: tab character where YAML expects spaces"),
        ("a: [1\n", "f.yml:2:1: YAML syntax error: expected ',' or ']', but got '<stream end>'"),
        ("<<: {a: 1}\n", "f.yml:1: YAML merge keys (<<) are not supported"),
        (
            "a: !!python/object/apply:os.system [touch x]\n",
            "f.yml:1: YAML tag tag:yaml.org,2002:python/object/apply:os.system is not supported",
        ),
        ("a:\n  b: !!set {x, y}\n", "f.yml:2: YAML tag tag:yaml.org,2002:set is not supported"),
        (
            "a: !custom x\n",
            "f.yml:1:4: YAML syntax error: could not determine a constructor for the tag '!custom'",
        ),
    ],
)
def test_malformed_yaml_names_file_and_line(text, message):
    with pytest.raises(SourceError) as exc:
        load_text_documents(text, "f.yml")
    assert str(exc.value) == message


def test_alias_bomb_is_refused_quickly():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)
    )
    with pytest.raises(SourceError, match="aliases"):
        load_text_documents(bomb, "bomb.yml")


def test_non_utf8_names_the_line():
    with pytest.raises(SourceError) as exc:
        decode_source(b"title: ok\ndescription: caf\xe9\n", "r.yml")
    assert str(exc.value) == "r.yml:2: not UTF-8: byte 0xe9 at offset 26"


def test_unreadable_file(tmp_path):
    with pytest.raises(SourceError, match="cannot read"):
        load_documents(tmp_path / "missing.yml")


def test_scalars_are_typed_like_safe_load():
    (doc,) = load_text_documents("n: 3\nf: 1.5\nb: true\nz: null\ns: '3'\n", "f.yml")
    assert doc.data == {"n": 3, "f": 1.5, "b": True, "z": None, "s": "3"}


def test_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(SourceError, match="nesting is too deep"):
        load_text_documents("a: " + "[" * 5000 + "]" * 5000 + "\n", "deep.yml")


def test_oversized_file_is_refused_before_parsing(tmp_path):
    from hpcsec.detector.core import yamlsrc

    path = tmp_path / "big.yml"
    path.write_bytes(b"# " + b"x" * yamlsrc.MAX_FILE_BYTES + b"\n")
    with pytest.raises(SourceError) as exc:
        load_documents(path)
    assert str(exc.value) == f"{path}: file is larger than {yamlsrc.MAX_FILE_BYTES} bytes"


def test_node_count_is_bounded(monkeypatch):
    from hpcsec.detector.core import yamlsrc

    monkeypatch.setattr(yamlsrc, "MAX_NODES", 5)
    assert load_text_documents("a: [1, 2]\n", "f.yml")[0].data == {"a": [1, 2]}
    with pytest.raises(SourceError) as exc:
        load_text_documents("a: [1, 2]\nb:\n  - 3\n  - 4\n", "f.yml")
    assert str(exc.value) == "f.yml:2: document has more than 5 nodes"  # at key `b`


def test_libyaml_path_reads_every_bundled_file_as_the_python_path_does() -> None:
    """The libyaml fast path gives the same values and the same lines, file by file."""
    from hpcsec.detector.core import yamlsrc

    root = Path(__file__).resolve().parents[3]
    files = sorted((root / "rules").rglob("*.yml")) + sorted((root / "rules").rglob("*.yaml"))
    assert files
    for path in files:
        text = path.read_text()
        fast = yamlsrc._fast_documents(text, str(path))
        assert fast is not None, path
        slow = list(yamlsrc.python_documents(text, str(path)))
        assert [(d.data, d.line, d.lines) for d in fast] == [
            (d.data, d.line, d.lines) for d in slow
        ]


def test_an_alias_leaves_the_fast_path_for_the_error_with_its_line() -> None:
    from hpcsec.detector.core import yamlsrc

    text = "a: &x [1]\nb: *x\n"
    assert yamlsrc._fast_documents(text, "f.yml") is None
    with pytest.raises(SourceError, match="aliases") as info:
        load_text_documents(text, "f.yml")
    assert info.value.location.line == 2


RICH = """\
plain: text
quoted: '3'
tagged: !!str 42
number: 7
hex: 0x1f
float: .5
yes_word: yes
nothing: ~
day: 2026-12-01
stamp: 2026-12-01T01:02:03Z
5: an int key
2026-01-02: a date key
"quoted key": [a, 'b', 3, {x: null}]
folded: >
  two
  lines
"""


def test_strings_taken_from_the_node_and_other_scalars_are_built_as_safe_load_builds_them():
    import yaml

    from hpcsec.detector.core import yamlsrc

    fast = yamlsrc._fast_documents(RICH, "f.yml")
    assert fast is not None
    assert fast[0].data == yaml.safe_load(RICH)
    assert [type(v) for v in fast[0].data.values()] == [
        type(v) for v in yaml.safe_load(RICH).values()
    ]
    (slow,) = yamlsrc.python_documents(RICH, "f.yml")
    assert (fast[0].data, fast[0].lines) == (slow.data, slow.lines)
    assert fast[0].lines[("quoted key", 3, "x")] == 13


# Texts the event builder reads as the pure-Python path does, or leaves to it (None).
ODD = [
    "",
    "# only a comment\n",
    "---\n",
    "--- 5\n",
    "--- plain\n--- [1, {a: b}]\n...\n--- {}\n",
    "a: &x 1\nb: 2\n",  # an anchor no alias uses
    "a: !!str 5\nb: ! 5\nc: !!int '7'\nd: !!float 1\ne: !!null ''\n",
    "? a\n: 1\n? [b]\n: 2\n",  # a collection as a key
    "<<: {a: 1}\n",  # a merge key
    "a: 1\na: 2\n",  # a repeated key
    "a: &x 1\nb: &x 2\n",  # a repeated anchor
    "a: !!set {x, y}\n",
    "a: !!python/object:os.system x\n",
    "1: a\n1.5: b\nfalse: c\n~: d\n2026-12-01: e\n'1': f\n",
    "a:\n- - - deep\n    - {x: [y, {z: ''}]}\n- []\n- {}\n"
    "b:\n  c: |\n    text\n  d: >-\n    more\n",
    "a: [1, 2\n",  # not YAML
    "tabs:\n\t- x\n",
    "- a\n- b: c\n  d: e\n- - f\n",
    "yes: no\nNULL: Null\n.inf: -.INF\n0o17: 0x1f\n017: 1_000\n",
    "a: b\t\n",  # a tab libyaml takes as a space, PyYAML's scanner refuses
    "a: [\t1]\n",
    "a: [x?y]\n",  # a `?` PyYAML ends a plain scalar at, in a flow collection
    "a: {x?y: 1}\n",
    "a: [{b: [c?]}]\n",
    "a: x?y\nb: ['x?y']\n",  # outside a flow collection, or quoted: a plain string
]


@pytest.mark.parametrize("text", ODD)
def test_the_event_builder_gives_what_the_python_path_gives(text: str) -> None:
    from hpcsec.detector.core import yamlsrc

    fast = yamlsrc._fast_documents(text, "f.yml")
    try:
        slow = [(d.data, d.line, d.lines) for d in yamlsrc.python_documents(text, "f.yml")]
    except SourceError:
        assert fast is None  # the error is the Python path's to report
        return
    if fast is not None:
        assert [(d.data, d.line, d.lines) for d in fast] == slow
        assert [[type(v) for v in d.data.values()] for d in fast if isinstance(d.data, dict)] == [
            [type(v) for v in data.values()] for data, _, _ in slow if isinstance(data, dict)
        ]


def test_the_event_builder_reads_plain_rule_texts_itself() -> None:
    from hpcsec.detector.core import yamlsrc

    for text in (ODD[4], ODD[5], ODD[6], ODD[13], ODD[14], ODD[17], ODD[18]):
        assert yamlsrc._fast_documents(text, "f.yml") is not None, text
    for text in (ODD[7], ODD[8], ODD[9], ODD[10], ODD[11], ODD[12], ODD[15]):
        assert yamlsrc._fast_documents(text, "f.yml") is None, text


def test_a_value_its_type_refuses_is_an_error_at_its_line_after_any_syntax_error() -> None:
    for value in ("!!bool maybe", "!!timestamp x", "!!int ''"):
        with pytest.raises(SourceError) as info:
            load_text_documents(f"a: 1\nb: {value}\n", "f.yml")
        tag = value.split()[0]
        assert str(info.value) == f"f.yml:2: YAML value is not a valid {tag}"
        # a syntax error after it is the one reported (the whole document is read first)
        with pytest.raises(SourceError, match="syntax error") as info:
            load_text_documents(f"a: 1\nb: {value}\nc: [unclosed\nd: 2\n", "f.yml")
        assert info.value.location is not None and info.value.location.line == 4


def test_a_key_named_like_the_builders_scratch_path_keeps_its_line() -> None:
    from hpcsec.detector.core import yamlsrc

    text = "<key>: 1\n5: a\n"
    fast = yamlsrc._fast_documents(text, "f.yml")
    (slow,) = yamlsrc.python_documents(text, "f.yml")
    assert fast is not None and (fast[0].data, fast[0].lines) == (slow.data, slow.lines)
    assert slow.lines[("<key>",)] == 1 and slow.lines[(5,)] == 2


@pytest.mark.parametrize("depth", [50, 100, 101, 400, 990])
def test_both_paths_refuse_the_same_nesting(depth: int) -> None:
    from hpcsec.detector.core import yamlsrc

    text = "a:\n  " + "[" * depth + "x" + "]" * depth + "\n"
    fast = yamlsrc._fast_documents(text, "f.yml")
    if depth <= yamlsrc.MAX_DEPTH - 1:  # the list at depth 1, its innermost value at depth+1
        assert fast is not None
        (slow,) = yamlsrc.python_documents(text, "f.yml")
        assert (fast[0].data, fast[0].lines) == (slow.data, slow.lines)
        return
    assert fast is None
    with pytest.raises(SourceError, match="YAML nesting is too deep") as info:
        load_text_documents(text, "f.yml")
    assert info.value.location is not None and info.value.location.line == 2


def test_texts_libyaml_reads_more_leniently_are_left_to_the_python_path() -> None:
    from hpcsec.detector.core import yamlsrc

    for text in ("a: b\t\n", "a: [\t1]\n", "a: [x?y]\n", "a: {x?y: 1}\n", "a: [{b: [c?]}]\n"):
        assert yamlsrc._fast_documents(text, "f.yml") is None, text
        with pytest.raises(SourceError, match="syntax error"):
            load_text_documents(text, "f.yml")
    assert yamlsrc._fast_documents("a: x?y\nb: ['x?y']\n", "f.yml") is not None


def test_a_lone_surrogate_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="U\\+D800"):
        load_text_documents("a: \ud800\n", "f.yml")
