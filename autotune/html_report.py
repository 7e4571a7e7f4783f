"""A self-contained HTML report of a search, readable offline: tables and inline SVG plots.

No plotting library is needed (the plots are SVG written here), so ``import autotune`` and the
report work on any machine the search ran on.
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Sequence
from typing import Any

from autotune.recommendation import Recommendation
from autotune.records import SEARCH_ROLES, TrialRecord, exclusion_lines
from autotune.report import (
    baseline_cells,
    baseline_memory_cell,
    baseline_over_limit_line,
    compile_line,
    loss_rule,
    memory_cell,
    numerics_line,
    recipe_lines,
    runner_up_line,
    selection_line,
    speedup_cell,
    throughput_cell,
    verification_line,
)
from autotune.search.driver import finished_recommendation
from autotune.search.storage import load_stored_study
from autotune.secrets import mask_url
from autotune.units import format_bytes, format_speed

_W, _H, _PAD = 640, 320, 64
IMPORTANCE_METHOD = "PED-ANOVA, Optuna's PedAnovaImportanceEvaluator"
"""What ``parameter_importances`` uses; the report's table names it."""
_COLOURS = {"ok": "#2b6cb0", "over": "#dd6b20", "winner": "#c53030", "line": "#718096"}


class _Scale:
    """Data values to pixels along one axis."""

    def __init__(self, values: Sequence[float], lo_px: float, hi_px: float) -> None:
        self.lo, self.hi = min(values), max(values)
        self.lo_px, self.hi_px = lo_px, hi_px

    def __call__(self, value: float) -> float:
        span = (self.hi - self.lo) or 1.0
        return self.lo_px + (value - self.lo) / span * (self.hi_px - self.lo_px)

    def ticks(self, count: int = 5) -> list[float]:
        return [self.lo + (self.hi - self.lo) * i / (count - 1) for i in range(count)]


def _tick_labels(xs: _Scale, ys: _Scale) -> list[str]:
    """Values along both axes, so that a reader can read a point off the plot."""
    base = _H - _PAD
    parts = []
    for value in xs.ticks():
        x = f"{xs(value):.1f}"
        parts.append(f'<line x1="{x}" y1="{base}" x2="{x}" y2="{base + 4}" stroke="black"/>')
        parts.append(
            f'<text x="{x}" y="{base + 16}" text-anchor="middle" font-size="11">{value:,.0f}</text>'
        )
    for value in ys.ticks():
        y = ys(value)
        parts.append(
            f'<line x1="{_PAD - 4}" y1="{y:.1f}" x2="{_PAD}" y2="{y:.1f}" stroke="black"/>'
        )
        parts.append(
            f'<text x="{_PAD - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
            f"{value:,.0f}</text>"
        )
    return parts


def _axes(x_label: str, y_label: str) -> list[str]:
    return [
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - 10}" y2="{_H - _PAD}" stroke="black"/>',
        f'<line x1="{_PAD}" y1="10" x2="{_PAD}" y2="{_H - _PAD}" stroke="black"/>',
        f'<text x="{_W / 2}" y="{_H - 10}" text-anchor="middle">{html.escape(x_label)}</text>',
        f'<text x="14" y="{_H / 2}" transform="rotate(-90 14 {_H / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>',
    ]


def _svg(parts: list[str], title: str) -> str:
    body = "\n".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'role="img" aria-label="{html.escape(title)}">{body}</svg>'
    )


def throughput_vs_memory(r: Recommendation) -> str:
    """Each measured trial: samples/s against peak memory, the limit line, the winner marked."""
    points = [t for t in r.trials if t.status == "ok" and t.samples_per_s and t.memory_used_bytes]
    if not points:
        return "<p>No measured trial to plot.</p>"
    mem = [t.memory_used_bytes / 2**20 for t in points]  # type: ignore[operator]
    xs = _Scale([*mem, r.memory_limit_bytes / 2**20, 0], _PAD, _W - 20)
    ys = _Scale([t.samples_per_s or 0.0 for t in points] + [0], _H - _PAD, 20)
    parts = _axes("peak memory (MiB)", "samples/s") + _tick_labels(xs, ys)
    limit_x = xs(r.memory_limit_bytes / 2**20)
    parts.append(
        f'<line x1="{limit_x:.1f}" y1="10" x2="{limit_x:.1f}" y2="{_H - _PAD}" '
        f'stroke="{_COLOURS["over"]}" stroke-dasharray="6 4"/>'
    )
    parts.append(f'<text x="{limit_x - 4:.1f}" y="24" text-anchor="end">memory limit</text>')
    for t, m in zip(points, mem, strict=True):
        winner = t.config == r.config
        colour = (
            _COLOURS["winner"] if winner else (_COLOURS["ok"] if t.feasible else _COLOURS["over"])
        )
        size = 7 if winner else 4
        label = html.escape(f"#{t.number} {t.config.summary() if t.config else ''}")
        parts.append(
            f'<circle cx="{xs(m):.1f}" cy="{ys(t.samples_per_s or 0):.1f}" '
            f'r="{size}" fill="{colour}"><title>{label}</title></circle>'
        )
    return _svg(parts, "throughput against peak memory")


def best_so_far(r: Recommendation) -> str:
    """Best feasible samples/s found against the search's cumulative trial time."""
    elapsed, best, steps = 0.0, 0.0, []
    for t in r.trials:
        elapsed += t.overhead_s + t.warmup_s + t.measured_s
        if t.role in SEARCH_ROLES and t.status == "ok" and t.feasible:
            best = max(best, t.samples_per_s or 0.0)
        if best:
            steps.append((elapsed, best))
    if not steps:
        return "<p>No feasible trial to plot.</p>"
    xs = _Scale([0.0] + [s[0] for s in steps], _PAD, _W - 20)
    ys = _Scale([0.0] + [s[1] for s in steps], _H - _PAD, 20)
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{xs(x):.1f},{ys(y):.1f}" for i, (x, y) in enumerate(steps)
    )
    parts = [
        *_axes("cumulative trial time (s)", "best feasible samples/s"),
        *_tick_labels(xs, ys),
        f'<path d="{path}" fill="none" stroke="{_COLOURS["ok"]}" stroke-width="2"/>',
    ]
    return _svg(parts, "best so far over time")


def importance_table(importances: dict[str, float]) -> str:
    if not importances:
        return "<p>Not enough completed trials to estimate which knobs mattered.</p>"
    rows = "".join(
        f'<tr><td>{html.escape(k)}</td><td><div class="bar" style="width:{v * 300:.0f}px">'
        f"</div> {v:.2f}</td></tr>"
        for k, v in importances.items()
    )
    header = f"importance ({IMPORTANCE_METHOD})"
    caveat = (
        "<p>Estimated from this search's completed trials: a hint, not a measurement; a knob "
        "value tried only once says little.</p>"
    )
    return f"<table><tr><th>knob</th><th>{header}</th></tr>{rows}</table>{caveat}"


def _trial_row(t: TrialRecord, winner: bool) -> str:
    speed = format_speed(t.samples_per_s) if t.samples_per_s else ""
    memory = memory_cell(t)
    fits = "" if t.feasible is None else ("yes" if t.feasible else "no")
    cells = [
        str(t.number),
        t.role,
        t.status,
        speed,
        memory,
        fits,
        t.config.summary() if t.config else "",
        t.message,
    ]
    style = ' class="winner"' if winner else ""
    return f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def render_html(r: Recommendation, importances: dict[str, float] | None = None) -> str:
    """The whole report as one HTML document."""
    base = r.baseline
    summary = [
        (
            "configuration",
            r.config.summary(),
            base.config.summary() if base and base.config else "-",
        ),
        ("samples/s", throughput_cell(r), baseline_cells(r)[0]),
        ("speed-up", speedup_cell(r), baseline_cells(r)[1]),
        (
            "peak memory",
            format_bytes(r.memory_used_bytes),
            baseline_memory_cell(r),
        ),
        (
            "memory limit",
            f"{format_bytes(r.memory_limit_bytes)} (budget {format_bytes(r.memory_budget_bytes)})",
            "",
        ),
        ("verification", verification_line(r), ""),
        ("global batch", f"{r.config.global_batch_size} ({r.global_batch_source})", ""),
        ("optimizer", f"{r.optimizer or '?'} ({r.optimizer_source})", ""),
    ]
    if (close := runner_up_line(r)) is not None:
        summary.insert(-3, ("runner-up", close.removeprefix("runner-up "), ""))
    if (luck := selection_line(r)) is not None:
        summary.insert(-3, ("winner's curse", luck.removeprefix("samples/s and speed-up: "), ""))
    summary[3:3] = [  # in the order the text report says them
        *(("standard recipe", line, "") for line in recipe_lines(r)),
        ("numerics", numerics_line(r).removeprefix("numerics").lstrip(": "), ""),
        *(("memory caveat", caveat, "") for caveat in r.memory_caveats),
        *(("throughput caveat", caveat, "") for caveat in r.throughput_caveats),
    ]
    if r.simpler_choice:
        summary.insert(3, ("chosen for changing less", r.simpler_choice, ""))
    if r.made_room:
        summary.insert(3, ("moved to fit", r.made_room, ""))
    if (rule := loss_rule(r)) is not None:
        summary.append(("loss", rule, ""))
    if r.config.compile != "off":
        summary.append(("compile", compile_line(r), ""))
    if base is not None and r.baseline_failed:
        summary.append(("baseline", "", f"{base.status}: {base.message}"))
    if (over := baseline_over_limit_line(r)) is not None:
        summary.append(("baseline", "", over.removeprefix("the baseline ")))
    summary_rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in summary
    )
    trials = "".join(_trial_row(t, t.config == r.config and t.role != "baseline") for t in r.trials)
    excluded = (
        "".join(f"<li>{html.escape(line)}</li>" for line in exclusion_lines(r.exclusions))
        or "<li>nothing</li>"
    )
    title = f"autotune report: {r.study_name}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 72em; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #cbd5e0; padding: 4px 8px; text-align: left; font-size: 90%; }}
tr.winner {{ background: #fed7d7; }}
.bar {{ display: inline-block; height: 10px; background: #2b6cb0; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(r.model)} on {html.escape(r.platform.device_name)}
({html.escape(r.platform.backend)}, torch {html.escape(r.platform.torch_version)}),
stored in {html.escape(mask_url(r.storage))}.</p>
<h2>Recommendation</h2>
<table><tr><th></th><th>recommended</th><th>baseline</th></tr>{summary_rows}</table>
<h2>Throughput against peak memory</h2>{throughput_vs_memory(r)}
<h2>Best so far</h2>{best_so_far(r)}
<h2>Which knobs mattered</h2>{importance_table(importances or {})}
<h2>Excluded before the search</h2><ul>{excluded}</ul>
<h2>All trials</h2>
<table><tr><th>#</th><th>role</th><th>status</th><th>samples/s</th><th>memory</th><th>fits</th>
<th>configuration</th><th>reason</th></tr>{trials}</table>
</body></html>
"""


def parameter_importances(study: Any) -> dict[str, float]:
    """Each knob's importance over the completed trials, by ``IMPORTANCE_METHOD``."""
    import optuna

    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    try:
        with warnings.catch_warnings():
            # "less than 2 trials" per value is the normal state of a short search; the report
            # already says the numbers come from few trials, a warning per knob says nothing
            warnings.simplefilter("ignore", UserWarning)
            return dict(optuna.importance.get_param_importances(study, evaluator=evaluator))
    except (ValueError, RuntimeError, ZeroDivisionError):  # too few or uniform trials
        return {}


def write_report(storage: str, study_name: str | None, path: str, costs: str | None = None) -> str:
    """Write the HTML report of a stored study to ``path``; return the path."""
    from pathlib import Path

    study, summary = load_stored_study(storage, study_name)
    recommendation = finished_recommendation(summary)
    document = render_html(recommendation, parameter_importances(study))
    if costs:
        document = document.replace(
            "<h2>Throughput against peak memory</h2>",
            f"<h2>Time and cost to train</h2><pre>{html.escape(costs)}</pre>"
            "<h2>Throughput against peak memory</h2>",
        )
    Path(path).write_text(document)
    return path
