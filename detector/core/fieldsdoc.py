"""docs/fields.md, generated from the field catalog so the two cannot drift apart."""

from __future__ import annotations

from hpcsec.detector.core.fields import ALERT_COPIED_PREFIXES, ALERT_FIELDS, CATEGORIES, FIELDS


def _cell(text: str) -> str:
    """A Markdown table cell: `a | b` in a description must not start a new column."""
    return text.replace("|", "\\|")


def fields_markdown() -> str:
    """The field table rule authors read (docs/fields.md is this text)."""
    out = [
        "# Event and alert fields",
        "",
        "Generated from `detector/core/fields.py` (`python -m hpcsec.detector.core.fieldsdoc`). "
        "Sigma rules use `logsource: {product: hpc, category: <event.category>}`.",
        "",
        "## Categories",
        "",
        "| category | events |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {text} |" for name, text in CATEGORIES.items()]
    out += [
        "",
        "## Event fields",
        "",
        "| field | type | categories | meaning |",
        "|---|---|---|---|",
    ]
    for f in FIELDS:
        cats = ", ".join(f.categories) or "any"
        out.append(f"| `{f.name}` | {f.type} | {cats} | {_cell(f.description)} |")
    out += [
        "",
        "An event that could not be tied to a Slurm job has no `slurm.job.id` "
        "(rules test `slurm.job.id: null`).",
        "",
        "`hpcsec scan --events FILE|-` reads one JSON object per line. A nested object "
        '(`{"process": {"name": "x"}}`) is read as dotted names. A line that is not '
        "a JSON object, that gives a one-value field (any type but `list`) a list or an "
        "object, or whose `@timestamp` is not text, is skipped, counted and reported on "
        "stderr with its line number; the other lines are still evaluated. An event "
        "without `event.id` gets a hash of its fields, as sensors' events do.",
        "",
        "## Alert fields",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{f.name}` | {f.type} | {_cell(f.description)} |" for f in ALERT_FIELDS]
    out += [
        "",
        "Alerts also carry the "
        + ", ".join(f"`{p}*`" for p in ALERT_COPIED_PREFIXES)
        + " fields of the triggering event when present.",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    print(fields_markdown(), end="")
