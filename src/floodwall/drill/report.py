"""A drill's results three ways: a terminal table, JSON, and a self-contained HTML report.

* :func:`table_rows` / :func:`render_text` / :func:`print_table`: one row per figure, one
  column per run (scenario × mode), for the terminal (``rich`` when installed, plain text
  otherwise);
* :func:`to_json`: every figure of every run, plain data (``None`` where a figure does not
  apply or was not reached);
* :func:`write_html`: one HTML file with no outside references. The figures tables are HTML;
  the charts are drawn as inline SVG by a small inline script from the run data embedded in
  the page (per run: success rate of healthy and affected routes and the full-answer rate,
  latency p50/p99, breaker states, edge workers busy and queued), fault windows shaded. Each
  chart is an ``<svg class="chart" data-kind=... data-mode=...>``; once drawn, the page sets
  ``document.body.dataset.rendered = "true"``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from floodwall.drill.metrics import DEFINITIONS, RECOVERY_HOLD, RECOVERY_WINDOW, Figures, series
from floodwall.drill.runner import RunResult

__all__ = [
    "CHART_KINDS",
    "ScenarioReport",
    "definitions",
    "html_report",
    "print_table",
    "render_text",
    "table_rows",
    "to_json",
    "verdict",
    "write_html",
]

CHART_KINDS = ("success", "latency", "breakers", "workers")
"""The charts drawn for every run, in order."""


@dataclass(frozen=True)
class ScenarioReport:
    """One scenario's runs (one per mode) with what the report says about them."""

    name: str
    description: str
    runs: Sequence[RunResult]
    workers: int | None = None
    """The edge's worker pool size (``None`` for an external edge)."""


# -- figures as text --------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _seconds(value: float | None, never: str) -> str:
    return never if value is None else f"{value:.2f} s"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _p99(f: Figures) -> str:
    if f.healthy_p99_ms_before is None and f.healthy_p99_ms_during is None:
        return "—"
    return f"{_ms(f.healthy_p99_ms_before)} → {_ms(f.healthy_p99_ms_during)} ms"


def _writes(f: Figures) -> str:
    if f.doubled_writes is None:
        return "—"
    return f"{f.doubled_writes} / {f.lost_writes}"


def _ledgers(f: Figures) -> str:
    """Doubled / lost per ledger: ``analytics 0 / 57 · inventory 0 / 0``."""
    if not f.audit:
        return "—"
    return " · ".join(f"{name} {b['doubled']} / {b['lost']}" for name, b in f.audit.items())


def _verdict(f: Figures) -> str:
    return "VOID" if f.void else "valid"


def _send_lag(f: Figures) -> str:
    return "—" if f.send_lag_p99_ms is None else f"{f.send_lag_p99_ms:.0f} ms"


def _count(value: int | None) -> str:
    return "—" if value is None else str(value)


def _amp(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _peaks(f: Figures, workers: int | None) -> str:
    if f.peak_workers_busy is None or workers is None:
        return "—"  # an external edge's workers are not ours to see
    pool = f"/{workers}"
    return f"{f.peak_workers_busy}{pool} busy, {f.peak_queued} q"


def _process(f: Figures) -> str:
    if f.peak_threads is None:
        return "—"
    rss = "?" if f.peak_rss_mb is None else f"{f.peak_rss_mb:.0f}"
    return f"{f.peak_sockets} sock, {f.peak_threads} thr, {rss} MB"


def _cpu_wait(f: Figures) -> str:
    """Run-queue wait in the worst second, before → fault: ``120 → 650 ms/s``."""
    before, during = f.cpu_wait_share_before, f.cpu_wait_share_during
    if before is None and during is None:
        return "—"
    return f"{_ms(before and before * 1000)} → {_ms(during and during * 1000)} ms/s"


def _lag(f: Figures) -> str:
    return "—" if f.peak_loop_lag_ms is None else f"{f.peak_loop_lag_ms:.0f} ms"


ROWS: tuple[tuple[str, Callable[[Figures, int | None], str]], ...] = (
    ("comparison", lambda f, _: _verdict(f)),
    ("healthy success, fault", lambda f, _: _pct(f.healthy_success_rate)),
    ("healthy success, before", lambda f, _: _pct(f.healthy_success_rate_before)),
    ("healthy p99 before → fault", lambda f, _: _p99(f)),
    ("first protective action", lambda f, _: _seconds(f.first_action_s, "never")),
    ("detection (open / shed)", lambda f, _: _seconds(f.detection_time_s, "never")),
    (
        f"recovery (held {RECOVERY_WINDOW * RECOVERY_HOLD:g} s)",
        lambda f, _: _seconds(f.recovery_time_s, "not in run"),
    ),
    ("doubled / lost writes", lambda f, _: _writes(f)),
    ("doubled / lost per ledger", lambda f, _: _ledgers(f)),
    ("charged, told failed", lambda f, _: _count(f.unconfirmed_writes)),
    ("calls/request, faulty dep.", lambda f, _: _amp(f.amplification)),
    ("success, all requests", lambda f, _: _pct(f.success_rate)),
    ("edge workers, peak", _peaks),
    ("process, peak", lambda f, _: _process(f)),
    ("event-loop lag, peak", lambda f, _: _lag(f)),
    ("load sent late, p99", lambda f, _: _send_lag(f)),
    ("CPU wait, worst s before → fault", lambda f, _: _cpu_wait(f)),
)
"""The comparison table: label and formatter per row."""


def table_rows(reports: Sequence[ScenarioReport]) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)``: one column per run, one row per figure."""
    header = ["figure"] + [f"{r.name}\n{run.mode}" for r in reports for run in r.runs]
    rows = []
    for label, show in ROWS:
        rows.append([label] + [show(run.figures, r.workers) for r in reports for run in r.runs])
    return header, rows


def definitions() -> list[str]:
    """The figures' definitions, one line each (shown under every table)."""
    return [f"{name}: {text}" for name, text in DEFINITIONS]


def render_text(reports: Sequence[ScenarioReport]) -> str:
    """The comparison table as plain text (fixed-width columns), then the definitions."""
    header, rows = table_rows(reports)
    header = [cell.replace("\n", " · ") for cell in header]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for index, row in enumerate([header, *rows]):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join([*lines, "", *definitions()])


def print_table(reports: Sequence[ScenarioReport], title: str = "drill results") -> None:
    """Print the comparison table (a ``rich`` table when rich is installed)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - the cli extra brings rich
        print(title)
        print(render_text(reports))
        return
    header, rows = table_rows(reports)
    table = Table(title=title, title_justify="left")
    table.add_column(header[0], no_wrap=True)
    for column in header[1:]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console = Console(highlight=False)
    console.print(table)
    for line in definitions():
        console.print(f"[dim]{line}[/]", soft_wrap=True)


def verdict(report: ScenarioReport) -> str:
    """One line on what the runs compare to, or why there is no verdict: a run whose load
    generator or event loop fell behind, that waited for a core, or whose healthy routes failed
    before the fault, voids
    the comparison (its figures measured the machine), and the line says so instead."""
    void = [f"{run.mode}: {run.figures.void}" for run in report.runs if run.figures.void]
    if void:
        return f"no verdict ({report.name}): the comparison is void; " + "; ".join(void)
    parts = []
    for run in report.runs:
        f = run.figures
        part = f"{run.mode}: healthy routes {_pct(f.healthy_success_rate)} during the fault"
        part += f", detection {_seconds(f.detection_time_s, 'never')}"
        if f.doubled_writes is not None:
            part += f", doubled / lost writes {_writes(f)}"
        parts.append(part)
    return f"verdict ({report.name}): " + "; ".join(parts)


# -- JSON --------------------------------------------------------------------------------------


def run_json(run: RunResult) -> dict[str, Any]:
    """One run's figures and context as plain data."""
    data = run.figures.as_dict()
    data["protection"] = run.protection
    data["wall_s"] = round(run.wall_s, 2)
    data["ledgers"] = run.ledgers
    data["notes"] = run.notes
    return data


def to_json(reports: Sequence[ScenarioReport]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{scenario: {mode: figures}}`` for every run."""
    return {r.name: {run.mode: run_json(run) for run in r.runs} for r in reports}


# -- HTML --------------------------------------------------------------------------------------


def _scenario_data(report: ScenarioReport, step: float) -> dict[str, Any]:
    runs = [
        {
            "mode": run.mode,
            "end": round(run.log.end, 3),
            "timeout_ms": run.log.timeout * 1000,
            "series": series(run.log, step).as_dict(),
        }
        for run in report.runs
    ]
    return {"name": report.name, "workers": report.workers, "runs": runs}


def _figures_table(report: ScenarioReport) -> str:
    head = "".join(f"<th>{html.escape(run.mode)}</th>" for run in report.runs)
    body = []
    for label, show in ROWS:
        cells = "".join(
            f"<td>{html.escape(show(run.figures, report.workers))}</td>" for run in report.runs
        )
        body.append(f"<tr><th scope='row'>{html.escape(label)}</th>{cells}</tr>")
    terms = "".join(
        f"<dt>{html.escape(name)}</dt><dd>{html.escape(text)}</dd>" for name, text in DEFINITIONS
    )
    return (
        f"<table class='figures'><tr><th></th>{head}</tr>{''.join(body)}</table>"
        f"<details class='definitions'><summary>what the figures mean</summary>"
        f"<dl>{terms}</dl></details>"
    )


def _protection(report: ScenarioReport) -> str:
    items = []
    for run in report.runs:
        lines = "".join(
            f"<li><code>{html.escape(dep)}</code>: <code>{html.escape(text)}</code></li>"
            for dep, text in sorted(run.protection.items())
        )
        items.append(f"<div><h4>{html.escape(run.mode)}</h4><ul>{lines}</ul></div>")
    return f"<div class='protection'>{''.join(items)}</div>"


def _faults(report: ScenarioReport) -> str:
    faults = report.runs[0].log.faults if report.runs else []
    items = "".join(
        f"<li>{f.start:g} s – {f.end:g} s: <b>{html.escape(f.target)}</b> "
        f"{html.escape(f.what)}</li>"
        for f in faults
    )
    return f"<ul class='faults'>{items}</ul>" if items else "<p>No faults.</p>"


def html_report(
    reports: Sequence[ScenarioReport], *, title: str = "floodwall drill", step: float = 0.5
) -> str:
    """The whole report as one HTML document (no outside references)."""
    data = {"title": title, "scenarios": [_scenario_data(r, step) for r in reports]}
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False, default=_no_nan)
    payload = payload.replace("</", "<\\/")  # never close the script element early
    sections = []
    for index, report in enumerate(reports):
        said = verdict(report)
        kind = "void" if said.startswith("no verdict") else "verdict"
        sections.append(
            f"<section><h2>{html.escape(report.name)}</h2>"
            f"<p>{html.escape(report.description)}</p>{_faults(report)}"
            f"<p class='{kind}'>{html.escape(said)}</p>"
            f"{_figures_table(report)}<div class='charts' id='charts-{index}'></div>"
            f"<details><summary>protection per dependency</summary>{_protection(report)}"
            f"</details></section>"
        )
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return _PAGE.format(
        title=html.escape(title),
        stamp=stamp,
        sections="".join(sections),
        data=payload,
        css=_CSS,
        js=_JS,
    )


def _no_nan(value: object) -> object:
    raise TypeError(f"not JSON: {value!r}")


def write_html(
    path: str | Path, reports: Sequence[ScenarioReport], *, title: str = "floodwall drill"
) -> Path:
    """Write :func:`html_report` to ``path`` (parents created); returns the absolute path."""
    target = Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html_report(reports, title=title), encoding="utf-8")
    return target


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><style>{css}</style></head>
<body><header><h1>{title}</h1><p class="stamp">{stamp} · generated by floodwall</p>
<p class="legend"><span class="sw healthy"></span>healthy routes (no faulty dependency)
<span class="sw affected"></span>routes using a faulty dependency
<span class="sw full"></span>full answers (no fallback), all routes
<span class="sw faultsw"></span>fault window</p></header>
{sections}
<noscript><p>The charts need JavaScript; the tables above hold every figure.</p></noscript>
<script type="application/json" id="drill-data">{data}</script>
<script>{js}</script></body></html>
"""

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{margin:0 0 4px}h2{margin:32px 0 4px;border-bottom:1px solid #ddd}
.stamp{color:#777;margin:0}
.void{background:#fdecea;border-left:4px solid #c62828;padding:6px 10px;font-weight:bold}
.verdict{color:#333}
table.figures{border-collapse:collapse;margin:12px 0}
table.figures th,table.figures td{border:1px solid #ddd;padding:3px 10px;text-align:right}
table.figures th[scope=row]{text-align:left;font-weight:normal;color:#444}
.charts{display:flex;flex-direction:column;gap:6px}
.row{display:flex;gap:16px;flex-wrap:wrap}.row h3{width:100%;margin:10px 0 0;font-size:14px}
.cell{display:flex;flex-direction:column}.cell span{font-size:12px;color:#555}
svg.chart{background:#fcfcfc;border:1px solid #e4e4e4}
svg text{font-size:10px;fill:#555}
.axis{stroke:#bbb;stroke-width:1}.grid{stroke:#eee;stroke-width:1}
.series{fill:none;stroke-width:1.6}
.healthy{stroke:#2e7d32}.affected{stroke:#ef6c00}.full{stroke:#1565c0;stroke-dasharray:4 2}
.p50{stroke:#66bb6a}.p99{stroke:#2e7d32}.ap99{stroke:#ef6c00}
.busy{stroke:#6a1b9a}.queued{stroke:#c62828}
rect.fault{fill:#e53935;fill-opacity:.10}
rect.state-CLOSED{fill:#a5d6a7}rect.state-OPEN,rect.state-FORCED_OPEN{fill:#ef9a9a}
rect.state-HALF_OPEN{fill:#ffe082}rect.state-FORCED_CLOSED,rect.state-DISABLED{fill:#cfd8dc}
.cursor{stroke:#999;stroke-dasharray:2 2}
.legend .sw{display:inline-block;width:18px;height:3px;margin:0 4px 3px 12px;vertical-align:middle}
.sw.healthy{background:#2e7d32}.sw.affected{background:#ef6c00}.sw.full{background:#1565c0}
.sw.faultsw{background:#f8d7d7;height:10px}
.protection{display:flex;gap:24px;flex-wrap:wrap}.protection ul{margin:0;padding-left:18px}
code{font-size:12px}
.key{font-weight:normal;font-size:12px;color:#555;margin-left:14px}
.key:before{content:"";display:inline-block;width:14px;height:3px;margin-right:4px;
  vertical-align:middle;background:#999}
.k-healthy:before,.k-p99:before{background:#2e7d32}.k-affected:before,.k-ap99:before{background:#ef6c00}
.k-full:before{background:#1565c0}.k-p50:before{background:#66bb6a}
.k-busy:before{background:#6a1b9a}.k-queued:before{background:#c62828}
.k-state-CLOSED:before{background:#a5d6a7;height:10px}.k-state-OPEN:before{background:#ef9a9a;height:10px}
.k-state-HALF_OPEN:before{background:#ffe082;height:10px}
"""

_JS = r"""
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var W = 470, H = 170, L = 46, R = 10, T = 10, B = 24;
  var data = JSON.parse(document.getElementById("drill-data").textContent);

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function text(parent, x, y, value, anchor) {
    var node = el("text", {x: x, y: y, "text-anchor": anchor || "start"}, parent);
    node.textContent = value;
    return node;
  }
  function X(t, end) { return L + (W - L - R) * (end > 0 ? t / end : 0); }
  function Y(v, max) { return H - B - (H - T - B) * (max > 0 ? Math.min(v, max) / max : 0); }

  function frame(svg, end, max, format) {
    for (var i = 0; i <= 4; i++) {
      var v = max * i / 4, y = Y(v, max);
      el("line", {x1: L, x2: W - R, y1: y, y2: y, "class": i ? "grid" : "axis"}, svg);
      text(svg, L - 4, y + 3, format(v), "end");
    }
    var step = end > 40 ? 10 : 5;
    for (var t = 0; t <= end; t += step) {
      text(svg, X(t, end), H - B + 13, t + "s", "middle");
    }
  }
  function faults(svg, run, end) {
    run.series.faults.forEach(function (f) {
      var x0 = X(f[0], end), x1 = X(f[1], end);
      el("rect", {x: x0, y: T, width: Math.max(1, x1 - x0), height: H - T - B,
                  "class": "fault"}, svg).appendChild(document.createElementNS(NS, "title"))
        .textContent = f[2] + ": " + f[3];
    });
  }
  function line(svg, ts, vs, end, max, cls, scale) {
    var d = "", pen = false;
    for (var i = 0; i < ts.length; i++) {
      var v = vs[i];
      if (v === null || v === undefined) { pen = false; continue; }
      d += (pen ? "L" : "M") + X(ts[i] + 0.5 * (ts[1] - ts[0] || 0), end).toFixed(1) + " " +
           Y(v * (scale || 1), max).toFixed(1);
      pen = true;
    }
    if (d) { el("path", {d: d, "class": "series " + cls}, svg); }
  }
  function hover(svg, run, end, describe) {
    var cursor = el("line", {y1: T, y2: H - B, "class": "cursor", visibility: "hidden"}, svg);
    var label = text(svg, W - R, T + 10, "", "end");
    svg.addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect();
      var x = (ev.clientX - box.left) * W / box.width;
      var t = (x - L) / (W - L - R) * end, ts = run.series.t;
      var i = Math.max(0, Math.min(ts.length - 1, Math.floor(t / run.series.step)));
      cursor.setAttribute("x1", x); cursor.setAttribute("x2", x);
      cursor.setAttribute("visibility", "visible");
      label.textContent = ts[i].toFixed(1) + "s: " + describe(i);
    });
    svg.addEventListener("mouseleave", function () {
      cursor.setAttribute("visibility", "hidden"); label.textContent = "";
    });
  }
  function pct(v) { return v === null ? "–" : Math.round(v * 100) + "%"; }
  function ms(v) { return v === null ? "–" : Math.round(v) + "ms"; }

  var CHARTS = {
    success: {title: "success rate",
      legend: [["healthy", "healthy routes"], ["affected", "affected routes"],
               ["full", "full answers"]],
      max: function () { return 1; },
      format: function (v) { return Math.round(v * 100) + "%"; },
      draw: function (svg, s, end) {
        line(svg, s.t, s.full_rate, end, 1, "full");
        line(svg, s.t, s.affected_success, end, 1, "affected");
        line(svg, s.t, s.healthy_success, end, 1, "healthy");
      },
      describe: function (s, i) {
        return "healthy " + pct(s.healthy_success[i]) + ", affected " +
               pct(s.affected_success[i]) + ", full " + pct(s.full_rate[i]);
      }},
    latency: {title: "latency",
      legend: [["p50", "healthy p50"], ["p99", "healthy p99"], ["ap99", "affected p99"]],
      max: function (runs) {
        var top = 0;
        runs.forEach(function (r) {
          r.series.healthy_p99_ms.concat(r.series.affected_p99_ms).forEach(function (v) {
            if (v !== null && v > top) { top = v; }
          });
          top = Math.min(top, r.timeout_ms * 1.05);
        });
        return top || 1;
      },
      format: function (v) { return Math.round(v) + "ms"; },
      draw: function (svg, s, end, max) {
        line(svg, s.t, s.affected_p99_ms, end, max, "ap99");
        line(svg, s.t, s.healthy_p50_ms, end, max, "p50");
        line(svg, s.t, s.healthy_p99_ms, end, max, "p99");
      },
      describe: function (s, i) {
        return "healthy p50 " + ms(s.healthy_p50_ms[i]) + ", p99 " + ms(s.healthy_p99_ms[i]) +
               "; affected p99 " + ms(s.affected_p99_ms[i]);
      }},
    breakers: {title: "circuit breakers",
      legend: [["state-CLOSED", "closed"], ["state-OPEN", "open"],
               ["state-HALF_OPEN", "half-open"]],
      max: function () { return 1; },
      format: function () { return ""; },
      draw: function (svg, s, end) {
        var names = Object.keys(s.breakers);
        if (!names.length) { text(svg, L + 8, T + 20, "no breaker changed state"); return; }
        var band = (H - T - B) / names.length;
        names.forEach(function (name, k) {
          s.breakers[name].forEach(function (span) {
            var x0 = X(span[0], end), x1 = X(span[1], end);
            var rect = el("rect", {x: x0, y: T + k * band + 2, width: Math.max(1, x1 - x0),
                                   height: band - 4, "class": "state state-" + span[2]}, svg);
            el("title", {}, rect).textContent = name + " " + span[2];
          });
          text(svg, L - 4, T + k * band + band / 2 + 3, name, "end");
        });
      },
      describe: function (s, i) {
        var t = s.t[i];
        return Object.keys(s.breakers).map(function (name) {
          var now = s.breakers[name].filter(function (sp) { return sp[0] <= t && t < sp[1]; });
          return name + " " + (now.length ? now[0][2] : "CLOSED");
        }).join(", ") || "–";
      }},
    workers: {title: "edge workers",
      legend: [["busy", "busy"], ["queued", "queued"]],
      max: function (runs, scenario) {
        var top = scenario.workers || 0;
        runs.forEach(function (r) {
          r.series.workers_busy.concat(r.series.queued).forEach(function (v) {
            if (v !== null && v > top) { top = v; }
          });
        });
        return top || 1;
      },
      format: function (v) { return String(Math.round(v)); },
      draw: function (svg, s, end, max) {
        line(svg, s.t, s.queued, end, max, "queued");
        line(svg, s.t, s.workers_busy, end, max, "busy");
      },
      describe: function (s, i) {
        return "busy " + s.workers_busy[i] + ", queued " + s.queued[i];
      }}
  };

  data.scenarios.forEach(function (scenario, index) {
    var host = document.getElementById("charts-" + index);
    if (!host) { return; }
    var end = 0;
    scenario.runs.forEach(function (r) { end = Math.max(end, r.end); });
    Object.keys(CHARTS).forEach(function (kind) {
      var spec = CHARTS[kind], row = document.createElement("div");
      row.className = "row";
      var title = document.createElement("h3");
      title.textContent = spec.title;
      spec.legend.forEach(function (item) {
        var key = document.createElement("span");
        key.className = "key k-" + item[0];
        key.textContent = item[1];
        title.appendChild(key);
      });
      row.appendChild(title);
      var max = spec.max(scenario.runs, scenario);
      scenario.runs.forEach(function (run) {
        var cell = document.createElement("div");
        cell.className = "cell";
        var caption = document.createElement("span");
        caption.textContent = run.mode;
        cell.appendChild(caption);
        var svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H,
                             "class": "chart", "data-kind": kind, "data-mode": run.mode});
        if (kind !== "breakers") { frame(svg, end, max, spec.format); }
        else {
          for (var t = 0; t <= end; t += (end > 40 ? 10 : 5)) {
            text(svg, X(t, end), H - B + 13, t + "s", "middle");
          }
        }
        faults(svg, run, end);
        spec.draw(svg, run.series, end, max);
        hover(svg, run, end, function (i) { return spec.describe(run.series, i); });
        cell.appendChild(svg);
        row.appendChild(cell);
      });
      host.appendChild(row);
    });
  });
  document.body.dataset.rendered = "true";
})();
"""
