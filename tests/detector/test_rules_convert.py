"""`hpcsec rules convert`: pySigma backends with our pipeline, checked on the SQLite backend."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import load_config
from hpcsec.detector.engine.convert import convert_ruleset
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import RuleSet

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules"
VALID, CONVERT = FIXTURES / "valid", FIXTURES / "convert"
COPY_TOOLS, SITE = CONVERT / "copy_tools.yml", CONVERT / "site.yml"

MINER_SQL = (
    "SELECT * FROM events WHERE `event.category` LIKE 'gpu\\_process' ESCAPE '\\' AND "
    "((`process.name` LIKE '%xmrig%' ESCAPE '\\' OR `process.name` LIKE '%t-rex%' ESCAPE '\\') "
    "OR `process.command_line` LIKE '%stratum+tcp://%' ESCAPE '\\')"
)
COPY_SQL = (
    "SELECT * FROM events WHERE `event.category` LIKE 'file\\_access' ESCAPE '\\' AND "
    "((`process.name`='rsync' OR `process.name`='scp') AND `hpcsec.asset.kind`='model' AND "
    "`file.size` >= 1048576)"
)


def convert(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["rules", "convert", "-t", "sqlite", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_detection_rule_to_sql(capsys):
    code, queries, err = convert(capsys, str(VALID))
    assert (code, err) == (0, "")
    assert queries[0] == MINER_SQL
    # the base rule of a `generate: false` correlation gives no query of its own; the
    # correlation's query carries it, with the filter that applies to it AND-ed in
    assert len(queries) == 2
    assert queries[1].startswith("WITH ")
    assert "(NOT COALESCE((`process.name`='gpu-burn'), 0))" in queries[1]
    assert "julianday(`@timestamp`)" in queries[1]  # our event time column


def events_db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    columns = [
        "@timestamp",
        "event.category",
        "process.name",
        "process.command_line",
        "hpcsec.asset.kind",
        "file.size",
    ]
    quoted = ", ".join(f'"{c}"' for c in columns)
    db.execute(f"CREATE TABLE events ({quoted})")
    rows = [
        ("2026-11-30T01:00:00Z", "gpu_process", "xmrig-6.21", None, None, None),
        (
            "2026-11-30T01:00:01Z",
            "gpu_process",
            "bash",
            "./m -o stratum+tcp://pool:3333",
            None,
            None,
        ),
        ("2026-11-30T01:00:02Z", "gpu_process", "python3", "train.py", None, None),
        ("2026-11-30T01:00:03Z", "process", "xmrig", None, None, None),  # other category
        ("2026-11-30T01:00:04Z", "file_access", "scp", None, "model", 5_000_000),
        ("2026-11-30T01:00:05Z", "file_access", "scp", None, "dataset", 5_000_000),
        ("2026-11-30T01:00:06Z", "file_access", "rsync", None, "model", 10),
        ("2026-11-30T01:00:07Z", "file_access", "cp", None, "model", 5_000_000),
    ]
    db.executemany(f"INSERT INTO events VALUES ({', '.join('?' * len(columns))})", rows)
    return db


def test_sql_selects_the_events_the_rule_means():
    db = events_db()
    names = [row[2] for row in db.execute(MINER_SQL)]
    assert names == ["xmrig-6.21", "bash"]
    assert [row[0] for row in db.execute(COPY_SQL)] == ["2026-11-30T01:00:04Z"]


def test_placeholders_filled_from_the_site_config(capsys):
    assert convert(capsys, "--config", str(SITE), str(COPY_TOOLS)) == (0, [COPY_SQL], "")


def test_placeholder_without_value_names_the_line(capsys):
    code, queries, err = convert(capsys, str(COPY_TOOLS))
    assert (code, queries) == (2, [])
    assert err == (
        f"hpcsec: error: {COPY_TOOLS}:12: placeholder %model_copy_tools% has no "
        "value: set it in the site config (lists or thresholds, --config) or give "
        "--placeholder-expression\n"
    )


def test_placeholder_as_lookup_expression(capsys):
    code, queries, _ = convert(
        capsys, "--placeholder-expression", "{field} IN (SELECT value FROM {id})", str(COPY_TOOLS)
    )
    assert code == 0
    assert queries == [
        "SELECT * FROM events WHERE `event.category` LIKE 'file\\_access' ESCAPE '\\' AND "
        "(`process.name` IN (SELECT value FROM model_copy_tools) AND "
        "`hpcsec.asset.kind`='model' AND `file.size` >= 1048576)"
    ]


def test_site_pipeline_file_runs_after_ours(capsys):
    code, queries, _ = convert(
        capsys, "-p", str(CONVERT / "rename.yml"), "--config", str(SITE), str(COPY_TOOLS)
    )
    assert code == 0
    assert queries == [COPY_SQL.replace("`process.name`", "proc_name")]


def test_backend_option_and_api():
    ruleset = load_rules([COPY_TOOLS])
    conversion = convert_ruleset(
        ruleset,
        "sqlite",
        placeholders={"model_copy_tools": ["rsync"]},
        backend_options={"table": "hpc_events"},
    )
    assert conversion.skipped == []
    (query,) = conversion.queries
    assert query.startswith("SELECT * FROM hpc_events WHERE ")
    assert "(`process.name`='rsync' AND" in query
    # conversion works on copies: the loaded rule keeps its placeholder for the engine
    assert "%model_copy_tools%" in str(ruleset.rules[0].sigma.to_dict()["detection"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-t", "no-such-backend"],
            "unknown target 'no-such-backend' (installed pySigma backends: ",
        ),
        (
            ["-t", "sqlite", "-p", "no-such-pipeline"],
            "pipeline 'no-such-pipeline' is neither an installed pySigma pipeline",
        ),
        (["-t", "sqlite", "-O", "table"], "backend option 'table' is not KEY=VALUE"),
    ],
)
def test_usage_errors(capsys, args, message):
    assert main(["rules", "convert", *args, "--config", str(SITE), str(COPY_TOOLS)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"hpcsec: error: {message}")
    assert err.count("\n") == 1


def test_malformed_rule_is_reported_not_converted(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "title: x\nlogsource: {product: hpc, category: process}\n"
        "detection:\n  sel:\n    process.name|re: '('\n  condition: sel\n"
    )
    code, queries, err = convert(capsys, str(bad))
    assert (code, queries) == (2, [])
    assert err == (
        f"hpcsec: error: {bad}:5: process.name|re: Regular expression '(' is "
        "invalid: missing ), unterminated subpattern at position 0\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "just text\n",
            "pipeline '{p}' is not a pySigma pipeline: AttributeError: 'str' object has "
            "no attribute 'keys'",
        ),
        (
            "name: x\ntransformations: [\n",
            "pipeline '{p}': Error in parsing of a Sigma processing pipeline",
        ),
        (
            "name: x\ntransformations:\n  - type: nosuch\n",
            "pipeline '{p}': Error in processing rule 1: Unknown transformation type 'nosuch'",
        ),
        (
            "name: x\ntransformations:\n  - type: field_name_mapping\n    mapping: 5\n",
            "sqlite: cannot apply the processing pipelines: 'int' object has no attribute 'get'",
        ),
    ],
)
def test_broken_pipeline_file_is_a_usage_error(tmp_path, capsys, text, message):
    pipeline = tmp_path / "site.yml"
    pipeline.write_text(text)
    code, queries, err = convert(
        capsys, "-p", str(pipeline), "--config", str(SITE), str(COPY_TOOLS)
    )
    assert (code, queries) == (2, [])
    assert err.startswith("hpcsec: error: " + message.format(p=pipeline))
    assert err.count("\n") == 1 and "Traceback" not in err


def sql_selects(query: str, events: list[dict]) -> list[str]:
    """`event.id`s the query selects from a table of `events`: one column per field, NOCASE as
    Zircolite builds it, since Sigma strings match case-insensitively."""
    db = sqlite3.connect(":memory:")
    columns = sorted({k for e in events for k in e})
    db.execute(f"CREATE TABLE events ({', '.join(f'{c!r} COLLATE NOCASE' for c in columns)})")
    db.executemany(
        f"INSERT INTO events VALUES ({', '.join('?' * len(columns))})",
        [
            [json.dumps(e[c]) if isinstance(e.get(c), list) else e.get(c) for c in columns]
            for e in events
        ],
    )
    query = query.replace("SELECT *", 'SELECT "event.id"', 1)
    while True:  # a field no test event has is a column of NULLs
        try:
            return sorted(row[0] for row in db.execute(query))
        except sqlite3.OperationalError as exc:
            missing = str(exc).removeprefix("no such column: ")
            if missing == str(exc):
                raise
            db.execute(f"ALTER TABLE events ADD COLUMN {missing!r} COLLATE NOCASE")


def test_bundled_rules_as_sql_select_what_the_engine_fires_on():
    """Differential: each bundled detection rule's test events, through our engine and through
    its `rules convert -t sqlite` query on sqlite3, fire on exactly the same events."""
    ruleset = load_rules(None)
    if not ruleset.tests:
        pytest.skip("no bundled rulesets yet")
    filters = [r for r in ruleset.rules if r.kind == "filter"]
    defaults = load_config(None).placeholders()
    compared = 0
    for test in ruleset.tests:
        rule = ruleset.by_id()[test.rule_id]
        if rule.kind != "detection":
            continue
        events = [{**e, "event.id": f"e{i}"} for i, e in enumerate(test.match + test.nomatch)]
        values = {**defaults, **test.placeholders}
        subset = RuleSet(rules=[rule, *filters])
        conversion = convert_ruleset(subset, "sqlite", placeholders=values)
        assert conversion.skipped == [], rule.title
        queries = conversion.queries
        if not queries:  # the base of a `generate: false` correlation has no query of its own
            continue
        (query,) = queries
        fired = sorted(
            {
                m.events[0]["event.id"]
                for m in Engine(subset, placeholders=values).evaluate(events)
                if m.rule is rule
            }
        )
        assert sql_selects(query, events) == fired, f"{test.path}:{test.line} {rule.sigma.title}"
        compared += 1
    assert compared >= 6  # at least one rule of each bundled ruleset
