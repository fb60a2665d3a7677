"""Alert tables for people: node data (user names, command lines) is shown, never obeyed."""

import io

from hpcsec.detector.cli import alerts as alerts_command
from hpcsec.detector.cli import render

HOSTILE = {
    "@timestamp": "2026-11-30T02:00:00.250+01:00",
    "rule.level": "high",
    "rule.title": "Miner on a GPU",
    "rule.vector": "gpu",
    "host.name": "gpu-017",
    "user.name": "[/][link=file:///etc/shadow]mallory\x1b]0;owned\x07",
    "alert.summary": "Miner on a GPU: [bold red]xmrig[/] --url \x1b[2J",
}


def test_the_rich_table_shows_markup_and_escapes_as_text():
    out = io.StringIO()
    render.write_table([HOSTILE], out=out, width=400)  # wide: each value on one line
    text = out.getvalue()
    assert "2026-11-30 01:00:00Z" in text  # UTC, whatever offset the event carried
    assert "\x1b" not in text and "\x07" not in text
    assert "[/][link=file:///etc/shadow]mallory\\x1b]0;owned\\x07" in text
    assert "[bold red]xmrig[/] --url \\x1b[2J" in text


def test_the_alerts_table_shows_control_characters_escaped():
    table = alerts_command.render_table([HOSTILE], width=400)
    assert "\x1b" not in table and "\x07" not in table
    assert "mallory\\x1b]0;owned\\x07" in table


def test_display_time_keeps_text_that_is_not_a_time():
    assert render.display_time("2026-11-30T01:02:03.456Z") == "2026-11-30 01:02:03Z"
    assert render.display_time("soon\x1b[0m") == "soon\\x1b[0m"
    assert render.display_time(None) == ""
