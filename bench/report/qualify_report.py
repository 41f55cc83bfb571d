#!/usr/bin/env python3
"""`mererun qualify report RESULTS.json... -o report.html`: one self-contained HTML page (inline
SVG plots, no scripts, no external files) from the JSON that the qualify commands write:

- qualify speed: decode tok/s of every sample in the reference / candidate / reference blocks,
  with each block's median, per workload; peak RSS per request;
- qualify likelihood: the perplexity ratio of every window, the 95 % bootstrap upper bound and
  the bar;
- qualify tasks: failures per fixture across the reference and candidate cohorts; per-request
  peak RSS and KV bytes;
- qualify claude-code: every session (holdout tests, tool calls, output-limit stops, wall time);
- deploy/measure.py: affinity against round-robin.

A file it does not recognise is listed as such (never dropped silently); a file that is not JSON
is an error.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import sys
import time
from pathlib import Path

W, H, PAD = 640, 260, 48
COLORS = {"reference": "#4c72b0", "candidate": "#dd8452", "ok": "#55a868", "bad": "#c44e52", "grid": "#dddddd"}


def esc(x) -> str:
    return html.escape(str(x))


def fmt(v, nd=3) -> str:
    if isinstance(v, float):
        return f"{v:.{nd}f}" if abs(v) < 1e6 else f"{v:.3g}"
    return esc(v)


class Plot:
    """A small SVG chart: linear axes, dots, bars, lines, labels."""

    def __init__(self, title: str, xlabels: list[str], ymin: float, ymax: float, ylabel: str):
        if ymax <= ymin:
            ymax = ymin + 1
        span = ymax - ymin
        # 5 % of air on each side, but never below zero for data that is not.
        self.ymin = max(0.0, ymin - 0.05 * span) if ymin >= 0 else ymin - 0.05 * span
        self.ymax = ymax + 0.05 * span
        self.xlabels, self.parts = xlabels, []
        self.title, self.ylabel = title, ylabel

    def x(self, i: float) -> float:
        n = max(1, len(self.xlabels))
        return PAD + (i + 0.5) * (W - 2 * PAD) / n

    def y(self, v: float) -> float:
        return H - PAD + (PAD - H + PAD) * (v - self.ymin) / (self.ymax - self.ymin)

    def dot(self, i: float, v: float, color: str, r: float = 3.5, tip: str = "") -> None:
        self.parts.append(f'<circle cx="{self.x(i):.1f}" cy="{self.y(v):.1f}" r="{r}" fill="{color}" '
                          f'fill-opacity="0.75"><title>{esc(tip)}</title></circle>')

    def bar(self, i: float, v: float, color: str, width: float = 0.6, base: float | None = None, tip: str = "") -> None:
        n = max(1, len(self.xlabels))
        wpx = width * (W - 2 * PAD) / n
        b = self.ymin if base is None else base
        y0, y1 = sorted((self.y(v), self.y(b)))
        self.parts.append(f'<rect x="{self.x(i) - wpx / 2:.1f}" y="{y0:.1f}" width="{wpx:.1f}" '
                          f'height="{max(1.0, y1 - y0):.1f}" fill="{color}"><title>{esc(tip)}</title></rect>')

    def tick(self, i: float, v: float, color: str, half: float = 0.3) -> None:
        n = max(1, len(self.xlabels))
        d = half * (W - 2 * PAD) / n
        self.parts.append(f'<line x1="{self.x(i) - d:.1f}" x2="{self.x(i) + d:.1f}" y1="{self.y(v):.1f}" '
                          f'y2="{self.y(v):.1f}" stroke="{color}" stroke-width="3"/>')

    def hline(self, v: float, color: str, label: str, dash: str = "5,4") -> None:
        y = self.y(v)
        self.parts.append(f'<line x1="{PAD}" x2="{W - PAD}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
                          f'stroke-dasharray="{dash}"/><text x="{W - PAD - 2}" y="{y - 4:.1f}" font-size="11" '
                          f'text-anchor="end" fill="{color}">{esc(label)}</text>')

    def svg(self) -> str:
        grid = []
        for k in range(5):
            v = self.ymin + (self.ymax - self.ymin) * k / 4
            y = self.y(v)
            grid.append(f'<line x1="{PAD}" x2="{W - PAD}" y1="{y:.1f}" y2="{y:.1f}" stroke="{COLORS["grid"]}"/>'
                        f'<text x="{PAD - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{v:.4g}</text>')
        step = max(1, math.ceil(len(self.xlabels) / 24))
        xl = [f'<text x="{self.x(i):.1f}" y="{H - PAD + 14}" font-size="10" text-anchor="middle">{esc(s)}</text>'
              for i, s in enumerate(self.xlabels) if i % step == 0]
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
                f'role="img"><title>{esc(self.title)}</title><rect width="{W}" height="{H}" fill="#ffffff"/>'
                f'<text x="{W / 2}" y="18" font-size="13" text-anchor="middle" font-weight="bold">{esc(self.title)}</text>'
                f'<text x="12" y="{H / 2}" font-size="11" transform="rotate(-90 12 {H / 2})" text-anchor="middle">'
                f'{esc(self.ylabel)}</text>{"".join(grid)}'
                f'<line x1="{PAD}" x2="{PAD}" y1="{PAD}" y2="{H - PAD}" stroke="#333"/>'
                f'<line x1="{PAD}" x2="{W - PAD}" y1="{H - PAD}" y2="{H - PAD}" stroke="#333"/>'
                f'{"".join(xl)}{"".join(self.parts)}</svg>')


def role_bars(title: str, values: list[tuple[str, float]], unit: str, labels: list[str] | None = None) -> str:
    """One bar per (role, value), coloured by role: per-request or per-run figures."""
    p = Plot(title, labels or [str(i + 1) for i in range(len(values))], 0, max(v for _, v in values), unit)
    for i, (role, v) in enumerate(values):
        p.bar(i, v, COLORS.get(role, "#888"), tip=f"{role}: {v:.1f} {unit}")
    return p.svg()


def table(head: list[str], rows: list[list], classes: list[str] | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for i, r in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{fmt(c)}</td>" for c in r) + "</tr>")
    return "".join(out) + "</table>"


def verdict_badge(v) -> str:
    v = str(v or "?").lower()
    cls = "ok" if v == "pass" else ("bad" if v == "fail" else "na")
    return f'<span class="badge {cls}">{esc(v.upper())}</span>'


# --- sections ------------------------------------------------------------------------------


def speed_section(d: dict, name: str) -> str:
    out = [f"<h2>Speed: {esc(d.get('model', ''))} {verdict_badge(d.get('verdict'))}</h2>",
           f"<p class='meta'>{esc(name)} · {esc(d.get('transport', 'in-process'))} · reference "
           f"<code>{esc(d.get('reference', {}).get('spec'))}</code> · candidate "
           f"<code>{esc(d.get('candidate', {}).get('spec'))}</code> · CPU {esc(d.get('cpu', {}).get('model', d.get('cpu')))}"
           f" · commit {esc(d.get('commit', ''))}</p>"]
    rows = []
    for w in d.get("workloads", []):
        blocks = w.get("blocks", [])
        vals = [s.get("decode_tok_s", 0) for b in blocks for s in b.get("samples", [])]
        labels = [f"{b.get('role', '?')} {i + 1}" for i, b in enumerate(blocks)]
        p = Plot(f"{w.get('name')}: decode tok/s per sample", labels, min(vals, default=0), max(vals, default=1),
                 "tok/s")
        for i, b in enumerate(blocks):
            color = COLORS["candidate"] if b.get("role") == "candidate" else COLORS["reference"]
            samples = b.get("samples", [])
            for j, s in enumerate(samples):
                p.dot(i + (j - (len(samples) - 1) / 2) * 0.06, s.get("decode_tok_s", 0), color,
                      tip=f"{s.get('decode_tok_s', 0):.2f} tok/s")
            if "median_decode_tok_s" in b:
                p.tick(i, b["median_decode_tok_s"], color)
        out.append(p.svg())
        rows.append([w.get("name"), w.get("pooled_reference_median_tok_s"), w.get("candidate_median_tok_s"),
                     w.get("change_pct"), "pass" if w.get("pass") else "fail"])
        rss = [(b.get("role"), s.get("peak_rss_bytes", 0) / 2**20) for b in blocks for s in b.get("samples", [])
               if s.get("peak_rss_bytes")]
        if rss:
            out.append(role_bars(f"{w.get('name')}: peak RSS per request", rss, "MiB"))
    out.append(table(["workload", "reference median tok/s", "candidate median tok/s", "change %", "workload verdict"],
                     rows))
    return "".join(out)


def likelihood_section(d: dict, name: str) -> str:
    ds = d.get("dataset", {})
    out = [f"<h2>Likelihood: {esc(d.get('model', {}).get('name'))} {verdict_badge(d.get('verdict'))}</h2>",
           f"<p class='meta'>{esc(name)} · {d.get('windows')} windows × {d.get('positions_per_window')} positions · "
           f"text {esc(ds.get('package') or ds.get('dir'))} (sha256 {esc(str(ds.get('text_sha256', ''))[:12])}…) · "
           f"reference <code>{esc(d.get('reference', {}).get('config'))}</code> · candidate "
           f"<code>{esc(d.get('candidate', {}).get('config'))}</code> · CPU {esc(d.get('cpu', {}).get('model'))}</p>"]
    wins = d.get("per_window", [])
    ratios = [math.exp((w["nll_candidate"] - w["nll_reference"]) / max(1, w["positions"])) for w in wins]
    bar = d.get("bar", {}).get("ppl_ratio_upper95_below", 1.001)
    ub = d.get("ppl_ratio_upper95", 1)
    p = Plot("perplexity ratio (candidate / reference) per window", [str(i + 1) for i in range(len(ratios))],
             min(ratios + [1.0, ub, bar]), max(ratios + [1.0, ub, bar]), "ratio")
    for i, r in enumerate(ratios):
        p.bar(i, r, COLORS["bad"] if r > bar else COLORS["ok"], base=1.0, tip=f"window {i + 1}: {r:.5f}")
    p.hline(1.0, "#333", "1", dash="2,2")
    p.hline(ub, COLORS["candidate"], f"95% upper bound {ub:.5f}")
    p.hline(bar, COLORS["bad"], f"bar {bar}")
    out.append(p.svg())
    out.append(table(["ppl reference", "ppl candidate", "ratio", "95% upper bound", "top-1 agreement", "mean KL"],
                     [[d.get("ppl_reference"), d.get("ppl_candidate"), d.get("ppl_ratio"), ub,
                       d.get("top1_agreement"), d.get("mean_kl")]]))
    return "".join(out)


def tasks_section(d: dict, name: str) -> str:
    out = [f"<h2>Tasks: {esc(d.get('model'))} {verdict_badge(d.get('verdict'))}</h2>",
           f"<p class='meta'>{esc(name)} · {d.get('cohorts_each')} cohorts per configuration · effort "
           f"{esc(d.get('effort'))} · max_tokens {d.get('max_tokens')} · reference <code>"
           f"{esc(d.get('reference', {}).get('spec'))}</code> · candidate <code>{esc(d.get('candidate', {}).get('spec'))}"
           f"</code> · {esc(d.get('sdk'))}{' · INTERRUPTED' if d.get('interrupted') else ''}</p>"]
    per = d.get("per_fixture", {})
    fids = list(per)
    if fids:
        p = Plot("failures per fixture (reference | candidate)", [f[:2] for f in fids], 0,
                 max([d.get("cohorts_each", 1)] + [max(v["reference"], v["candidate"]) for v in per.values()]),
                 "failed cohorts")
        for i, f in enumerate(fids):
            p.bar(i - 0.18, per[f]["reference"], COLORS["reference"], width=0.34, base=0,
                  tip=f"{f}: reference {per[f]['reference']}")
            p.bar(i + 0.18, per[f]["candidate"], COLORS["candidate"], width=0.34, base=0,
                  tip=f"{f}: candidate {per[f]['candidate']}")
        out.append(p.svg())
    worse = set(d.get("fixtures_worse", []))
    reasons = {}
    for c in d.get("cohorts", []):
        for r in c.get("results", []):
            if not r.get("ok"):
                reasons.setdefault(r["fixture"], r.get("reason", ""))
    out.append(table(["fixture", "reference failures", "candidate failures", "a failure's reason"],
                     [[f, f"{v['reference']}/{v['reference_runs']}", f"{v['candidate']}/{v['candidate_runs']}",
                       reasons.get(f, "")[:120]] for f, v in per.items()],
                     ["bad" if f in worse else "" for f in per]))
    res = [(c["role"], r["resources"]) for c in d.get("cohorts", []) for r in c.get("results", [])
           if r.get("resources")]
    if res:
        for key, label in (("peak_rss_bytes", "peak RSS per request"), ("kv_peak_bytes", "KV bytes per request")):
            out.append(role_bars(label, [(role, rr.get(key, 0) / 2**20) for role, rr in res], "MiB"))
    out.append(f"<p>Resource failures: {d.get('resource_failures', 0)} (bounds: {esc(d.get('bounds') or 'none')})</p>")
    return "".join(out)


def claude_code_section(d: dict, name: str) -> str:
    out = [f"<h2>Claude Code sessions: {esc(d.get('model'))} {verdict_badge(d.get('verdict'))}</h2>",
           f"<p class='meta'>{esc(name)} · {esc(d.get('claude_code'))} · effort {esc(d.get('effort'))} · "
           f"max turns {d.get('max_turns')}{' · INTERRUPTED' if d.get('interrupted') else ''}</p>"]
    runs = d.get("runs", [])
    out.append(table(["configuration", "run", "verdict", "holdout", "visible", "tool calls", "output-limit stops",
                      "wall s", "protected files changed"],
                     [[r["role"], r["run"], "pass" if r["pass"] else "fail",
                       f"{r['holdout_passed']}/{r['holdout_total']}", f"{r['visible_passed']}/{r['visible_total']}",
                       r["tool_calls"], r["output_limit_stops"], r["wall_s"], ", ".join(r["protected_changed"]) or "—"]
                      for r in runs], ["" if r["pass"] else "bad" for r in runs]))
    if runs:
        out.append(role_bars("client wall time per session", [(r["role"], r["wall_s"]) for r in runs], "s",
                             [f"{r['role'][:3]} {r['run']}" for r in runs]))
    return "".join(out)


def deploy_section(d: dict, name: str) -> str:
    af, rr = d["affinity"], d["round_robin"]
    out = [f"<h2>Replicas behind HAProxy: {d.get('replicas')} × {esc(d.get('model'))} {verdict_badge(d.get('verdict'))}</h2>",
           f"<p class='meta'>{esc(name)} · CPU {esc(d.get('cpu'))} · commit {esc(d.get('commit'))}</p>"]
    keys = ("own_prefix_hit_rate", "any_prefix_hit_rate", "mean_prompt_fraction_read")
    p = Plot("follow-up turns: affinity vs round-robin", ["own conversation", "any prefix", "prompt fraction"], 0, 1,
             "rate")
    for i, k in enumerate(keys):
        p.bar(i - 0.18, af[k], COLORS["candidate"], width=0.34, base=0, tip=f"affinity {af[k]:.3f}")
        p.bar(i + 0.18, rr[k], COLORS["reference"], width=0.34, base=0, tip=f"round-robin {rr[k]:.3f}")
    out.append(p.svg())
    out.append(table(["", "affinity", "round-robin"],
                     [[k, af[k], rr[k]] for k in keys + ("follow_up_latency_median_s", "failed_requests")]))
    return "".join(out)


def classify(d: dict) -> str:
    schema = str(d.get("schema", ""))
    if schema.startswith("mererun-qualify-tasks"):
        return "tasks"
    if schema.startswith("mererun-qualify-claude-code"):
        return "claude-code"
    if schema.startswith("mererun-qualify-likelihood") or "per_window" in d:
        return "likelihood"
    if "workloads" in d and "criterion" in d:
        return "speed"
    if "affinity" in d and "round_robin" in d:
        return "deploy"
    return ""


SECTIONS = {"speed": speed_section, "likelihood": likelihood_section, "tasks": tasks_section,
            "claude-code": claude_code_section, "deploy": deploy_section}

CSS = """body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ccc;padding-bottom:4px}
table{border-collapse:collapse;margin:10px 0;font-size:12px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#f2f2f2}tr.bad td{background:#fbe3e3}.meta{color:#555;font-size:12px}svg{display:block;margin:8px 0}
.badge{padding:1px 8px;border-radius:8px;font-size:12px;color:#fff}.badge.ok{background:#55a868}
.badge.bad{background:#c44e52}.badge.na{background:#888}code{background:#f4f4f4;padding:0 3px}"""


def render(paths: list[str]) -> str:
    body, index = [], []
    for p in paths:
        try:
            d = json.loads(Path(p).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"mererun qualify report: {p}: {e}")
        kind = classify(d) if isinstance(d, dict) else ""
        if not kind:
            body.append(f"<h2>{esc(Path(p).name)}</h2><p>Not a qualify result this report knows (schema "
                        f"{esc(d.get('schema') if isinstance(d, dict) else type(d).__name__)}); listed, not drawn.</p>")
            index.append([Path(p).name, "unknown", ""])
            continue
        try:
            body.append(SECTIONS[kind](d, Path(p).name))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            body.append(f"<h2>{esc(Path(p).name)}</h2><p class='bad'>Could not draw this {kind} result: "
                        f"{esc(type(e).__name__)}: {esc(e)}</p>")
        index.append([Path(p).name, kind, str(d.get("verdict", "")).upper()])
    head = (f"<h1>mererun qualification report</h1><p class='meta'>generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
            f" from {len(paths)} file(s)</p>" + table(["file", "kind", "verdict"], index))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>mererun qualification report</title>"
            f"<style>{CSS}</style></head><body>{head}{''.join(body)}</body></html>\n")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mererun qualify report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="qualify JSON files")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--mererun", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    page = render(a.results)
    Path(a.output).write_text(page, encoding="utf-8")
    print(f"wrote {a.output} ({len(page) // 1024} KiB, {len(a.results)} result file(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
