"""The HTML page: one file with its CSS, the data as safely embedded JSON, plotly.js inlined once, and a small script.

No network: a Content-Security-Policy forbids every fetch, fonts are the system's, and plotly.js is inlined.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from rollout_diag.report.markup import escape
from rollout_diag.report.sections import Section

# Only inline code and data: URLs may load; no request can leave the page.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:"

CSS = """
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --soft:#f6f8fa; --ok:#1a7f37; --watch:#9a6700; --bad:#cf222e; }
* { box-sizing: border-box; }
html { scroll-behavior: smooth; }
body { margin:0; color:var(--fg); background:#fff; line-height:1.5; font-size:14px;
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width:1180px; margin:0 auto; padding:28px 32px 64px; }
h1 { font-size:26px; margin:0 0 2px; word-break:break-word; }
h2 { font-size:20px; margin:44px 0 10px; padding-bottom:6px; border-bottom:1px solid var(--line); }
h3 { font-size:15px; margin:22px 0 6px; }
h4.strip-title { font-size:13px; font-weight:600; margin:16px 0 4px; word-break:break-word; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
  font-size:12.5px; }
code { background:var(--soft); padding:0 4px; border-radius:4px; white-space:pre-wrap; word-break:break-all; }
td:first-child > code:only-child { word-break:normal; overflow-wrap:break-word; } /* ids stay whole */
.subtitle, .muted, .note { color:var(--muted); }
.note { font-size:13px; }
.lead { margin:4px 0 10px; max-width:900px; }
a { color:#0969da; text-decoration:none; } a:hover { text-decoration:underline; }
nav.toc { display:flex; flex-wrap:wrap; gap:6px 18px; padding:10px 14px; margin:18px 0 0; background:var(--soft);
  border:1px solid var(--line); border-radius:8px; font-size:13px; }
nav.toc strong { margin-right:4px; }
.overall { margin:16px 0 12px; padding:10px 14px; border-radius:8px; border:1px solid var(--line); font-size:15px; }
.overall.bad { background:#ffebe9; border-color:#ffcecb; } .overall.watch { background:#fff8c5; border-color:#eed888; }
.overall.ok { background:#dafbe1; border-color:#aceebb; }
.badge { display:inline-block; padding:0 9px; border-radius:10px; font-size:12px; font-weight:600; line-height:20px;
  text-transform:uppercase; letter-spacing:.03em; }
.badge.ok { background:#dafbe1; color:var(--ok); } .badge.watch { background:#fff1a8; color:var(--watch); }
.badge.bad { background:#ffcecb; color:var(--bad); } .badge.na { background:#eaeef2; color:var(--muted); }
.cards { display:grid; grid-template-columns:repeat(3, 1fr); gap:10px; }
@media (max-width: 900px) { .cards { grid-template-columns:1fr 1fr; } }
.card { border:1px solid var(--line); border-left:4px solid #8c959f; border-radius:8px; padding:8px 12px;
  font-size:12.5px; }
.card.ok { border-left-color:var(--ok); } .card.watch { border-left-color:#d4a72c; }
.card.bad { border-left-color:var(--bad); }
.card-top { display:flex; justify-content:space-between; align-items:center; }
.card .metric { font-weight:600; font-size:13.5px; }
.card .value { font-size:22px; font-variant-numeric:tabular-nums; margin:2px 0; }
.card .meaning { margin-top:2px; }
dl.facts { display:grid; grid-template-columns:max-content 1fr; gap:2px 14px; margin:16px 0 0; font-size:13px; }
dl.facts dt { color:var(--muted); } dl.facts dd { margin:0; word-break:break-word; }
h2.findings-title { font-size:16px; margin-top:20px; border:none; padding:0; }
ul.findings, ul.warnings { margin:4px 0; padding-left:20px; }
ul.warnings li { color:var(--watch); }
p.finding { margin:6px 0; padding:6px 10px; background:#fff8c5; border-radius:6px; }
.table-wrap { overflow-x:auto; margin:6px 0 12px; }
table { border-collapse:collapse; font-size:12.5px; width:100%; }
th, td { padding:4px 8px; border-bottom:1px solid #eaeef2; text-align:left; vertical-align:top; }
th { background:var(--soft); font-weight:600; white-space:nowrap; position:sticky; top:0; }
th[title] { text-decoration:underline dotted; cursor:help; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tr.intrusive td { background:#fff8c5; }
.glossary table { table-layout:fixed; }
.glossary th:nth-child(1) { width:32%; } .glossary th:nth-child(2) { width:30%; }
.glossary code { white-space:nowrap; word-break:normal; }
details { margin:4px 0; } summary { cursor:pointer; font-weight:600; padding:4px 0; }
.plot { width:100%; margin:4px 0 8px; }
.strip { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:12.5px; line-height:1.9;
  white-space:pre-wrap; word-break:break-all; border:1px solid var(--line); border-radius:6px; padding:6px 8px;
  max-height:260px; overflow:auto; }
.tok { border-radius:2px; } .tok.env { color:#8c959f; background:#eef0f2; }
.blk { display:inline-block; width:6px; height:16px; margin:0 1px 2px 0; vertical-align:middle; border-radius:1px; }
.blk.env { background:#d8dee4; }
.round { font-size:10px; line-height:14px; color:#fff; background:#57606a; border-radius:3px; padding:0 4px;
  margin:0 3px; font-family:system-ui, sans-serif; }
.legend { display:flex; align-items:center; gap:8px; flex-wrap:wrap; font-size:12px; color:var(--muted); margin:6px 0; }
.legend .ramp { width:220px; height:12px; border-radius:3px; border:1px solid var(--line);
  background:linear-gradient(to right, rgb(9,105,218), #fff, rgb(207,34,46)); }
.legend .swatch { padding:0 6px; margin-left:12px; }
#tip { position:fixed; z-index:20; background:#1f2328; color:#fff; font-size:12px; padding:6px 9px; border-radius:6px;
  pointer-events:none; white-space:pre; max-width:460px; display:none; font-family: ui-monospace, Menlo, monospace; }
footer { margin-top:48px; padding-top:12px; border-top:1px solid var(--line); color:var(--muted); font-size:12px; }
"""

# Set before anything else runs, so the render test can see any script error in the dumped DOM.
ERROR_HOOK = """
window.onerror = function (message) {
  document.documentElement.setAttribute("data-report-error", String(message));
};
window.addEventListener("unhandledrejection", function (event) {
  document.documentElement.setAttribute("data-report-error", String(event.reason));
});
document.addEventListener("securitypolicyviolation", function (event) {
  document.documentElement.setAttribute("data-report-error", "blocked: " + event.blockedURI);
});
"""

SCRIPT = """
(function () {
  var payload = JSON.parse(document.getElementById("report-data").textContent);
  // No toolbar: it sat over the top-right of every chart (a heatmap's worst cell, a panel's title at 800 px);
  // drag zooms and a double-click zooms out without it.
  var config = {displaylogo: false, responsive: true, displayModeBar: false};
  var root = document.documentElement;
  var tip = document.getElementById("tip");
  payload.strips.forEach(function (strip) { drawStrip(strip, payload.catastrophic, tip); });
  // The first chart and any on screen now; the rest one per task, on-screen ones first, so the page
  // shows and scrolls while they draw.
  var pending = Array.prototype.slice.call(document.querySelectorAll("div.plot[data-figure]"));
  pending.filter(function (div, index) { return index === 0 || onScreen(div); }).forEach(draw);
  root.setAttribute("data-report-first", String(Math.round(performance.now())));
  setTimeout(drawNext, 0);

  function draw(div) {
    pending.splice(pending.indexOf(div), 1);
    var figure = payload.figures[div.getAttribute("data-figure")];
    Plotly.newPlot(div, figure.data, figure.layout, config);
  }

  function drawNext() {
    if (pending.length === 0) {
      root.setAttribute("data-report-ready", String(Math.round(performance.now())));
      return;
    }
    draw(pending.filter(onScreen)[0] || pending[0]);
    setTimeout(drawNext, 0);
  }

  function onScreen(div) {
    var box = div.getBoundingClientRect();
    return box.top < window.innerHeight && box.bottom > 0;
  }

  function drawStrip(strip, threshold, tip) {
    var box = document.getElementById(strip.id);
    var fragment = document.createDocumentFragment();
    var text = strip.token !== null;
    for (var i = 0; i < strip.mask.length; i++) {
      var model = strip.mask[i] === 1;
      if (model && strip.rounds > 1 && (i === 0 || strip.mask[i - 1] !== 1)) {
        var label = document.createElement("span");
        label.className = "round";
        label.textContent = "R" + strip.round[i];
        fragment.appendChild(label);
      }
      var span = document.createElement("span");
      span.className = (text ? "tok" : "blk") + (model ? "" : " env");
      span.setAttribute("data-i", i);
      if (text) { span.textContent = visible(strip.token[i]); }
      if (model) { span.style.background = deltaColor(strip.delta[i], threshold); }
      if (model && text && Math.abs(strip.delta[i]) > 0.6 * threshold) { span.style.color = "#fff"; }
      fragment.appendChild(span);
    }
    box.appendChild(fragment);
    box.addEventListener("mousemove", function (event) {
      var index = event.target.getAttribute && event.target.getAttribute("data-i");
      if (index === null || index === undefined) { tip.style.display = "none"; return; }
      tip.textContent = describe(strip, Number(index));
      tip.style.left = Math.min(event.clientX + 14, window.innerWidth - 470) + "px";
      tip.style.top = (event.clientY + 16) + "px";
      tip.style.display = "block";
    });
    box.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  }

  function visible(token) {
    if (token === null) { return "\\u2205"; }
    if (token === "") { return "\\u00b7"; }
    return token.replace(/\\t/g, "\\u21e5").replace(/\\n/g, "\\u21b5\\n");
  }

  function deltaColor(delta, threshold) {
    var strength = Math.min(1, Math.sqrt(Math.abs(delta) / threshold));
    var base = delta > 0 ? [207, 34, 46] : [9, 105, 218];
    var mix = base.map(function (channel) { return Math.round(255 + (channel - 255) * strength); });
    return "rgb(" + mix.join(",") + ")";
  }

  function describe(strip, i) {
    var lines = ["position " + (strip.start + i) + (strip.mask[i] ? "   round " + strip.round[i] : "   environment")];
    var token = strip.token ? JSON.stringify(strip.token[i]) : null;
    var id = strip.token_id ? "id " + strip.token_id[i] : null;
    if (token || id) { lines.push("token " + [token, id].filter(Boolean).join("  ")); }
    if (!strip.mask[i]) { lines.push("not scored (mask 0)"); return lines.join("\\n"); }
    var delta = strip.delta[i];
    if (strip.rollout) {
      var rollout = strip.rollout[i], trainer = rollout + delta;
      lines.push("trainer logprob " + trainer.toPrecision(4) + "  (p " + Math.exp(trainer).toPrecision(3) + ")");
      lines.push("rollout logprob " + rollout.toPrecision(4) + "  (p " + Math.exp(rollout).toPrecision(3) + ")");
    }
    lines.push("\\u03b4 = " + (delta >= 0 ? "+" : "") + delta.toPrecision(4));
    return lines.join("\\n");
  }
})();
"""


def render_page(
    title: str, header: str, sections: Sequence[Section], payload: dict[str, Any], footer: str, plotly_js: str
) -> str:
    """The whole HTML document; ``plotly_js`` is inlined once, ``payload`` embedded as JSON."""
    if "</script" in plotly_js.lower():  # would end the inline script early; plotly's bundle never has it
        raise ValueError("plotly.js bundle contains '</script': cannot inline it safely")
    toc = "".join(f'<a href="#{s.anchor}">{escape(s.title)}</a>' for s in sections)
    body = "".join(f'<section id="{s.anchor}"><h2>{escape(s.title)}</h2>{s.body}</section>' for s in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="generator" content="rollout-diag">'
        f"<title>{escape(title, limit=200)}</title>"
        f"<style>{CSS}</style><script>{ERROR_HOOK}</script></head>"
        f'<body><main><header id="summary">{header}'
        f'<nav class="toc"><strong>Contents</strong>{toc}</nav></header>'
        f'{body}<footer>{footer}</footer></main><div id="tip"></div>'
        f'<script type="application/json" id="report-data">{script_json(payload)}</script>'
        f"<script>{plotly_js}</script><script>{SCRIPT}</script></body></html>\n"
    )


def script_json(value: Any) -> str:
    """JSON safe inside <script>: no '<', '>', '&' or line separators survive unescaped, so no '</script>'."""
    text = json.dumps(compact(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def compact(value: Any, digits: int = 6) -> Any:
    """Floats to ``digits`` significant digits (NaN and ±inf to null), recursively: a smaller, valid JSON."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): compact(item, digits) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(item, digits) for item in value]
    return value
