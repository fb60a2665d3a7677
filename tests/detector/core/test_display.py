"""`visible`: node text shown to a person keeps every visible character and escapes the rest."""

import json
import re

import orjson
import pytest

from hpcsec.detector.core import display
from hpcsec.detector.core.display import visible, visible_json

# What the people on a node can put in a name, path or command line.
CORPUS = {
    "ansi clear": ("a\x1b[2Jb", "a\\x1b[2Jb"),
    "osc title": ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),
    "osc 8 link": ("\x1b]8;;http://e.x\x1b\\l", "\\x1b]8;;http://e.x\\x1b\\l"),
    "CR LF forged line": (
        "x\r\nhpcsec: sensor process: ok",
        "x\\x0d\\x0ahpcsec: sensor process: ok",
    ),
    "NUL and DEL": ("a\x00b\x7f", "a\\x00b\\x7f"),
    "C1 CSI": ("a\x9b2J", "a\\x9b2J"),
    "tab": ("a\tb", "a\\x09b"),
    "bidi override": ("invoice\u202egpj.exe", "invoice\\u202egpj.exe"),
    "bidi isolates": ("\u2066a\u2069\u2067b\u2068", "\\u2066a\\u2069\\u2067b\\u2068"),
    "zero width": ("ro\u200bot\u200c\u200d\u200e\u200f", "ro\\u200bot\\u200c\\u200d\\u200e\\u200f"),
    "separators": ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
    "bom": ("\ufeffroot", "\\ufeffroot"),
    "tag characters": ("a\U000e0041", "a\\U000e0041"),
    "undecodable byte": (b"\xffsl".decode("utf-8", "surrogateescape"), "\\xffsl"),
    "markup stays text": (
        "[black on black]x[/] [link=file:///etc]",
        "[black on black]x[/] [link=file:///etc]",
    ),
    "letters stay": ("Jürgen 中文 ✓ \\xff", "Jürgen 中文 ✓ \\xff"),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_visible_escapes_what_a_terminal_obeys_or_hides(case):
    raw, shown = CORPUS[case]
    assert visible(raw) == shown


def test_visible_takes_any_value():
    assert visible(None) == "None"
    assert visible(42) == "42"


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_visible_json_is_the_same_value_without_raw_controls(case):
    raw, _ = CORPUS[case]
    if "\udcff" in raw:  # not a JSON string; jsonenc writes such bytes as \\xNN first
        return
    encoded = visible_json(orjson.dumps({"v": raw}, option=orjson.OPT_INDENT_2))
    assert json.loads(encoded) == {"v": raw}
    text = encoded.decode()
    assert visible(text.replace("\n", "")) == text.replace("\n", "")  # nothing left to escape


def test_the_ascii_shortcut_escapes_what_the_class_escapes() -> None:
    """visible() skips the regex for printable ASCII text: every ASCII character, alone and
    among others, comes out as the full character class has it."""

    full = re.compile(display._INVISIBLE)
    for code in range(128):
        char = chr(code)
        for text in (char, f"a{char}b", f"{char} {char}"):
            assert visible(text) == full.sub(display._escape, text)
    assert visible("plain ascii ~!") == "plain ascii ~!"
    assert visible("caf\u00e9\u200b") == "caf\u00e9\\u200b"  # not ASCII: the class decides


def test_every_control_format_and_separator_character_of_this_unicode_is_escaped():
    # the explicit ranges of display.py against this Python's Unicode database: a format
    # character left out (U+1BCA0, an invisible shorthand control) reaches a terminal raw
    import sys
    import unicodedata

    shown = [
        hex(code)
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in ("Cc", "Cf", "Zl", "Zp", "Cs")
        and visible(chr(code)) == chr(code)
    ]
    assert shown == []
