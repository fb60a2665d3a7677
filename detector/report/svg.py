"""The report's plots as inline SVG, drawn here: no plotting library, no script, no external
asset. Every label comes from a node (host names, vectors of local rules) and goes through
`esc`, like the rest of the page; a `<title>` on each mark is the tooltip a browser shows."""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from hpcsec.detector.core.display import visible
from hpcsec.detector.core.timefmt import parse_time, year_first

# colour-blind friendly (Okabe-Ito), then greys for rulesets beyond the bundled six
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#d55e00", "#56b4e9", "#f0e442")
EXTRA = "#888888"
# time steps a bucket may have: the smallest that gives at most MAX_BUCKETS bars
STEPS_S = (1, 5, 10, 30, 60, 300, 900, 1800, 3600, 6 * 3600, 86400, 7 * 86400)
MAX_BUCKETS = 48
LABEL_CHARS = 32


def esc(value: Any) -> str:
    """Node text as HTML/SVG text: invisible characters escaped first, then markup."""
    return html.escape(visible(value), quote=True)


def short(value: Any, width: int = LABEL_CHARS) -> str:
    text = visible(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def vector_colors(vectors: Sequence[str]) -> dict[str, str]:
    return {v: PALETTE[i] if i < len(PALETTE) else EXTRA for i, v in enumerate(vectors)}


def _epoch(alert: Mapping[str, Any]) -> float | None:
    for key in ("alert.first_seen", "@timestamp"):
        try:
            return parse_time(str(alert.get(key))).timestamp()
        except ValueError:
            continue
    return None


def _label(epoch: float, step: int) -> str:
    # a bucket's start may fall before year 1 (event times are node data): the earliest day
    when = datetime.fromtimestamp(min(max(epoch, _FIRST_S), _LAST_S), UTC)
    if step >= 86400:
        return year_first(when)[:10]
    return when.strftime("%H:%M:%S" if step < 60 else "%m-%d %H:%M")


_FIRST_S = datetime(1, 1, 1, tzinfo=UTC).timestamp()
_LAST_S = datetime(9999, 12, 31, tzinfo=UTC).timestamp()


def _step(span: float) -> int:
    """The smallest of STEPS_S that gives at most MAX_BUCKETS bars; past the largest (times
    years apart, as a node may write them), whole multiples of it."""
    for step in STEPS_S:
        if span / step < MAX_BUCKETS:
            return step
    return STEPS_S[-1] * (int(span // (STEPS_S[-1] * (MAX_BUCKETS - 1))) + 1)


def alerts_over_time(
    alerts: Sequence[Mapping[str, Any]], colors: Mapping[str, str], width: int = 960
) -> str:
    """Stacked bars: alerts by the time of their first event, one colour per vector."""
    stamped = [(t, str(a.get("rule.vector"))) for a in alerts if (t := _epoch(a)) is not None]
    if not stamped:
        return '<p class="empty">No alert has a time to plot.</p>'
    start, end = min(t for t, _ in stamped), max(t for t, _ in stamped)
    step = _step(end - start)
    first = int(start // step)
    buckets = int(end // step) - first + 1
    counts: list[Counter[str]] = [Counter() for _ in range(buckets)]
    for t, vector in stamped:
        counts[int(t // step) - first][vector] += 1
    top = max(sum(c.values()) for c in counts)
    height, left, bottom, plot_top = 240, 44, 36, 12
    plot_h = height - bottom - plot_top
    bar_w = (width - left - 8) / buckets
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="alerts over time by vector">',
        f'<line x1="{left}" y1="{plot_top + plot_h}" x2="{width - 4}" y2="{plot_top + plot_h}" '
        'stroke="#555"/>',
    ]
    for tick in sorted({0, top // 2, top}):
        y = plot_top + plot_h - plot_h * tick / top
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{tick}</text>'
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - 4}" y2="{y:.1f}" stroke="#ddd"/>'
        )
    for i, bucket in enumerate(counts):
        x, y = left + i * bar_w, float(plot_top + plot_h)
        for vector in sorted(bucket):
            h = plot_h * bucket[vector] / top
            y -= h
            when = _label((first + i) * step, step)
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                f'height="{h:.1f}" fill="{colors.get(vector, EXTRA)}">'
                f"<title>{esc(when)}: {bucket[vector]} {esc(vector)}</title></rect>"
            )
    every = max(1, buckets // 8)
    for i in range(0, buckets, every):
        x = left + i * bar_w + bar_w / 2
        parts.append(
            f'<text x="{x:.1f}" y="{height - bottom + 16}" text-anchor="middle" '
            f'font-size="11">{esc(_label((first + i) * step, step))}</text>'
        )
    parts.append(
        f'<text x="{width - 4}" y="{height - 4}" text-anchor="end" font-size="11" '
        f'fill="#555">one bar per {step} s, UTC</text></svg>'
    )
    return "".join(parts)


def _shade(fraction: float) -> str:
    """White to dark red as a share of the busiest cell."""
    r = 255 - int(75 * fraction)
    gb = 255 - int(230 * fraction)
    return f"#{r:02x}{gb:02x}{gb:02x}"


def node_vector_heatmap(alerts: Sequence[Mapping[str, Any]], vectors: Sequence[str]) -> str:
    """Alerts per node (rows) and vector (columns); the number is in each cell."""
    counts = Counter((str(a.get("host.name")), str(a.get("rule.vector"))) for a in alerts)
    nodes = sorted({node for node, _ in counts})
    if not nodes:
        return '<p class="empty">No alerts.</p>'
    top = max(counts.values())
    cell_w, cell_h, left, head = 110, 28, 8 + 7 * LABEL_CHARS, 40
    width, height = left + cell_w * len(vectors) + 8, head + cell_h * len(nodes) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="alerts per node and vector">'
    ]
    for j, vector in enumerate(vectors):
        x = left + j * cell_w + cell_w / 2
        parts.append(
            f'<text x="{x:.0f}" y="{head - 12}" text-anchor="middle" font-size="11">'
            f"{esc(short(vector, 16))}</text>"
        )
    for i, node in enumerate(nodes):
        y = head + i * cell_h
        parts.append(
            f'<text x="{left - 8}" y="{y + cell_h / 2 + 4:.0f}" text-anchor="end" '
            f'font-size="12">{esc(short(node))}</text>'
        )
        for j, vector in enumerate(vectors):
            n = counts.get((node, vector), 0)
            x = left + j * cell_w
            colour = "#f4f4f4" if n == 0 else _shade(n / top)
            ink = "#fff" if n / top > 0.6 else "#222"
            parts.append(
                f'<rect x="{x + 1}" y="{y + 1}" width="{cell_w - 2}" height="{cell_h - 2}" '
                f'fill="{colour}"><title>{esc(node)} / {esc(vector)}: {n}</title></rect>'
                f'<text x="{x + cell_w / 2:.0f}" y="{y + cell_h / 2 + 4:.0f}" '
                f'text-anchor="middle" font-size="12" fill="{ink}">{n or ""}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
