#!/usr/bin/env python3
"""`mererun qualify tasks`: the frozen task cohort (bench/tasks/fixtures/*.json), through the
official Anthropic Python SDK, against a reference and a candidate server configuration.

Cohorts run alternately: reference, candidate, reference, candidate, ... (--cohorts each, 3 by
default), every fixture once per cohort, with the model's default sampling, adaptive thinking at
high effort (`output_config.effort: "high"`) and a 2,048-token output budget. Each fixture has a
deterministic checker (the `check` object; kinds below). Failures stay failures: an API error, a
reasoning section that used the whole budget, a fixture that cannot be graded (its checker
raises) and a request over a resource bound all count.

Frozen per-fixture bar: PASS when no fixture fails more often across the candidate cohorts than
across the reference cohorts (and no request went over a resource bound). Exit status: 0 PASS,
3 FAIL, 1 a set-up error (no server, no model), 2 usage, 130 interrupted (what was measured is
written, marked interrupted).

A CONFIG is `url=http://HOST:PORT` (a running server) or a comma list of
`draft=off|ngram|model:NAME|..., k=auto|N, path=fast|ref, weights=native|q8g64, cpu=..., threads=N`
for a `mererun serve` this program starts (the keys become MERERUN_* variables).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "deploy"))
from cluster import health  # noqa: E402  (GET /health: status and body, errors included)
ENV_KEYS = {"draft": "MERERUN_DRAFT", "k": "MERERUN_DRAFT_TOKENS", "path": "MERERUN_PATH",
            "weights": "MERERUN_WEIGHTS", "cpu": "MERERUN_CPU", "threads": "MERERUN_THREADS"}


class SetupError(Exception):
    pass


# --- configurations and servers ------------------------------------------------------------


def parse_config(spec: str) -> dict:
    cfg = {"spec": spec, "env": {}, "url": ""}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, eq, val = part.partition("=")
        if not eq or not val:
            raise SetupError(f"CONFIG '{spec}': '{part}' is not key=value")
        if key == "url":
            cfg["url"] = val.rstrip("/")
        elif key in ENV_KEYS:
            cfg["env"][ENV_KEYS[key]] = val
        else:
            raise SetupError(f"CONFIG '{spec}': unknown key '{key}' (keys: url, {', '.join(ENV_KEYS)})")
    if cfg["url"] and cfg["env"]:
        raise SetupError(f"CONFIG '{spec}': url= names a running server; it takes no other keys")
    return cfg


class Server:
    """A `mererun serve` started for one configuration, or a running one given by URL."""

    def __init__(self, cfg: dict, mererun: str, model: str, ctx: int, extra: list[str]):
        self.cfg, self.proc, self.log_path = cfg, None, None
        if cfg["url"]:
            self.url = cfg["url"]
            try:
                code, body = health(self.url)
            except OSError as e:
                raise SetupError(f"no server at {self.url} ({e})") from None
            if code != 200:
                raise SetupError(f"the server at {self.url} is not ready (/health {code}: {body.get('status')})")
            self.health = body
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        fd, self.log_path = tempfile.mkstemp(prefix="mererun-qualify-tasks-", suffix=".log")
        self.proc = subprocess.Popen([mererun, "serve", "-m", model, "--port", str(port), "-c", str(ctx), *extra],
                                     stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                     env={**os.environ, **cfg["env"]})
        os.close(fd)
        deadline = time.time() + 600
        while True:
            if self.proc.poll() is not None:
                tail = Path(self.log_path).read_text(errors="replace")[-1500:]
                raise SetupError(f"mererun serve ({cfg['spec']}) exited with {self.proc.returncode}:\n{tail}")
            try:
                code, body = health(self.url, timeout=2)
                if code == 200:
                    self.health = body
                    return
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise SetupError(f"mererun serve ({cfg['spec']}) was not ready in 600 s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --- grading -------------------------------------------------------------------------------


def same_json(a, b) -> bool:
    """Equal as JSON values with exact types: 3 is not 3.0, true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def pointer(doc, ptr: str):
    """RFC 6901 JSON pointer; KeyError when absent."""
    cur = doc
    for tok in ptr.split("/")[1:]:
        tok = tok.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, list):
            if not tok.isdigit() or int(tok) >= len(cur):
                raise KeyError(ptr)
            cur = cur[int(tok)]
        elif isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        else:
            raise KeyError(ptr)
    return cur


def extract_json(text: str):
    """The answer's JSON value: the whole text, else a fenced block, else the first value that
    parses from a '{' or '['. ValueError when there is none."""
    t = text.strip()
    m = re.search(r"```(?:json)?\s*\n(.*?)```", t, re.S)
    for cand in (t, m.group(1).strip() if m else None):
        if cand:
            try:
                return json.loads(cand)
            except ValueError:
                pass
    dec = json.JSONDecoder()
    for i, ch in enumerate(t):
        if ch in "[{":
            try:
                return dec.raw_decode(t, i)[0]
            except ValueError:
                continue
    raise ValueError("no JSON value in the answer")


def validate(instance, schema: dict) -> str:
    import jsonschema
    errs = sorted(jsonschema.Draft202012Validator(schema).iter_errors(instance), key=lambda e: list(e.path))
    return "; ".join(f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errs[:3])


def check_expect(doc, expect: dict, ci: bool = False) -> str:
    for ptr, want in expect.items():
        try:
            got = pointer(doc, ptr)
        except KeyError:
            return f"{ptr} is missing"
        if ci:
            if not isinstance(got, str) or got.strip().lower() != want.lower():
                return f"{ptr} is {json.dumps(got, ensure_ascii=False)}, expected {json.dumps(want, ensure_ascii=False)}"
        elif not same_json(got, want):
            return f"{ptr} is {json.dumps(got, ensure_ascii=False)}, expected {json.dumps(want, ensure_ascii=False)}"
    return ""


def grade(fx: dict, request: dict, resp: dict) -> str:
    """'' when the response passes the fixture's check, else why not."""
    chk = fx["check"]
    kind = chk["kind"]
    text, calls, stop = resp["text"], resp["tool_calls"], resp["stop_reason"]
    needs_answer = kind not in ("stop", "usage_agreement", "stream_consistency")
    if needs_answer and not text.strip() and not calls:
        if stop == "max_tokens":
            return "no answer: the output budget ran out" + (" in the reasoning" if resp["thinking_chars"] else "")
        return f"no answer (stop_reason {stop})"
    if kind == "tool_call":
        mine = [c for c in calls if c["name"] == chk["name"]]
        if not mine:
            return f"no call of {chk['name']} (calls: {[c['name'] for c in calls]}, stop_reason {stop})"
        args = mine[0]["input"]
        tool = next((t for t in request.get("tools", []) if t["name"] == chk["name"]), None)
        if tool and (err := validate(args, tool["input_schema"])):
            return f"input does not match the tool's schema: {err}"
        if "reference_schema" in chk:
            ref = json.loads((HERE / chk["reference_schema"]).read_text())
            if err := validate(args, ref):
                return f"input does not match {chk['reference_schema']}: {err}"
        return check_expect(args, chk.get("expect", {})) or check_expect(args, chk.get("expect_ci", {}), ci=True)
    if kind == "json_answer":
        try:
            doc = extract_json(text)
        except ValueError as e:
            return str(e)
        if chk.get("schema_from_request"):
            if err := validate(doc, request["output_config"]["format"]["schema"]):
                return f"answer does not match the requested schema: {err}"
        if "expect" in chk and not same_json(doc, chk["expect"]):
            return f"answer {json.dumps(doc, ensure_ascii=False)[:200]}, expected {json.dumps(chk['expect'], ensure_ascii=False)}"
        return check_expect(doc, chk.get("expect_paths", {}))
    if kind == "text":
        missing = [s for s in chk["all"] if s not in text]
        return f"answer lacks {missing}" if missing else ""
    if kind == "regex":
        return "" if re.search(chk["pattern"], text) else f"answer {text[:120]!r} does not match {chk['pattern']}"
    if kind == "error_acknowledged":
        if calls:
            return ""  # calling the tool again (with another argument) is a fair way to handle it
        low = text.lower()
        if re.search(chk["forbid_regex"], text):
            return f"answer states a figure the tool never gave: {text[:160]!r}"
        return "" if any(s in low for s in chk["any"]) else f"answer does not report the error: {text[:160]!r}"
    if kind == "stop":
        if stop != chk["stop_reason"]:
            return f"stop_reason {stop}, expected {chk['stop_reason']}"
        if "stop_sequence" in chk and resp["stop_sequence"] != chk["stop_sequence"]:
            return f"stop_sequence {resp['stop_sequence']!r}, expected {chk['stop_sequence']!r}"
        if any(s in text.lower() for s in chk.get("none", [])):
            return f"text after the stop sequence: {text[-80:]!r}"
        if "max_output_tokens" in chk and resp["usage"]["output_tokens"] > chk["max_output_tokens"]:
            return f"{resp['usage']['output_tokens']} output tokens > {chk['max_output_tokens']}"
        return ""
    if kind == "uppercase":
        letters = [c for c in text if c.isalpha()]
        if not letters or any(c.islower() for c in letters):
            return f"not all uppercase: {text[:120]!r}"
        missing = [s for s in chk.get("all_ci", []) if s.lower() not in text.lower()]
        return f"answer lacks {missing}" if missing else ""
    if kind == "usage_agreement":
        u = resp["usage"]
        total = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        return "" if total == resp["count_tokens"] else f"count_tokens {resp['count_tokens']} != usage total {total}"
    if kind == "stream_consistency":
        return resp["stream_problem"]
    raise ValueError(f"unknown check kind {kind!r}")


# --- running a fixture ---------------------------------------------------------------------


def build_request(fx: dict, max_tokens: int, effort: str) -> dict:
    req = json.loads(json.dumps(fx["request"]))
    req["model"] = "m"
    req["max_tokens"] = fx.get("max_tokens", max_tokens)
    if fx.get("effort", "default") != "none" and effort != "none":
        req["thinking"] = {"type": "adaptive"}
        req.setdefault("output_config", {})["effort"] = effort
    return req


def summarize_message(msg) -> dict:
    text = "".join(b.text for b in msg.content if b.type == "text")
    return {"text": text,
            "tool_calls": [{"name": b.name, "input": b.input} for b in msg.content if b.type == "tool_use"],
            "thinking_chars": sum(len(getattr(b, "thinking", "") or "") for b in msg.content if b.type == "thinking"),
            "stop_reason": msg.stop_reason, "stop_sequence": msg.stop_sequence,
            "usage": {"input_tokens": msg.usage.input_tokens, "output_tokens": msg.usage.output_tokens,
                      "cache_read_input_tokens": msg.usage.cache_read_input_tokens or 0,
                      "cache_creation_input_tokens": msg.usage.cache_creation_input_tokens or 0}}


def run_stream(client, req: dict) -> dict:
    order, deltas, open_blocks, problem = [], [], set(), ""
    with client.messages.stream(**req) as stream:
        for ev in stream:
            order.append(ev.type)
            if ev.type == "content_block_start":
                open_blocks.add(ev.index)
            elif ev.type == "content_block_delta":
                if ev.index not in open_blocks:
                    problem = problem or f"delta for block {ev.index} outside its start/stop"
                if ev.delta.type == "text_delta":
                    deltas.append(ev.delta.text)
            elif ev.type == "content_block_stop":
                open_blocks.discard(ev.index)
        final = stream.get_final_message()
    out = summarize_message(final)
    raw = [t for t in order if t in ("message_start", "message_delta", "message_stop")]
    if not order or order[0] != "message_start":
        problem = problem or "the stream does not open with message_start"
    elif raw[-2:] != ["message_delta", "message_stop"]:
        problem = problem or f"the stream does not end with message_delta, message_stop: {raw[-2:]}"
    elif open_blocks:
        problem = problem or f"blocks never stopped: {sorted(open_blocks)}"
    elif "".join(deltas) != out["text"]:
        problem = problem or "the final message's text is not the text deltas joined"
    elif out["usage"]["output_tokens"] < 1:
        problem = problem or "usage reports no output tokens"
    out["stream_problem"] = problem
    return out


def run_fixture(client, fx: dict, args) -> dict:
    import anthropic
    req = build_request(fx, args.max_tokens, args.effort)
    rec = {"fixture": fx["id"], "ok": False, "reason": "", "resources": {}}
    t0 = time.time()
    try:
        if fx["check"]["kind"] == "stream_consistency":
            resp = run_stream(client, req)
        else:
            raw = client.messages.with_raw_response.create(**req)
            resp = summarize_message(raw.parse())
            h = raw.headers
            rec["resources"] = {k: int(h[f"x-mererun-{k.replace('_', '-')}"]) for k in
                                ("peak_rss_bytes", "kv_peak_bytes", "process_peak_rss_bytes")
                                if f"x-mererun-{k.replace('_', '-')}" in h}
            if fx["check"]["kind"] == "usage_agreement":
                ct = {k: v for k, v in req.items() if k in ("model", "messages", "system", "tools", "tool_choice",
                                                            "thinking", "output_config")}
                resp["count_tokens"] = client.messages.count_tokens(**ct).input_tokens
        rec["seconds"] = time.time() - t0
        rec.update(stop_reason=resp["stop_reason"], usage=resp["usage"], text=resp["text"][:2000],
                   tool_calls=resp["tool_calls"], thinking_chars=resp["thinking_chars"])
        try:
            rec["reason"] = grade(fx, req, resp)
        except Exception as e:  # an ungradeable fixture is a failure, never a skip
            rec["reason"] = f"could not be graded: {type(e).__name__}: {e}"
        rec["ok"] = rec["reason"] == ""
    except anthropic.APIError as e:
        rec.update(seconds=time.time() - t0, reason=f"API error: {type(e).__name__}: {str(e)[:300]}")
    res = rec["resources"]
    over = []
    if args.max_rss_mb and res.get("peak_rss_bytes", 0) > args.max_rss_mb * 2**20:
        over.append(f"peak RSS {res['peak_rss_bytes'] / 2**20:.0f} MiB > {args.max_rss_mb} MiB")
    if args.max_kv_mb and res.get("kv_peak_bytes", 0) > args.max_kv_mb * 2**20:
        over.append(f"KV {res['kv_peak_bytes'] / 2**20:.1f} MiB > {args.max_kv_mb} MiB")
    rec["resource_ok"] = not over
    rec["resource_problem"] = "; ".join(over)
    return rec


# --- the run -------------------------------------------------------------------------------


def load_fixtures(d: Path, only: str) -> list[dict]:
    files = sorted(d.glob("*.json"))
    if not files:
        raise SetupError(f"no fixtures in {d}")
    out = []
    for f in files:
        try:
            fx = json.loads(f.read_text(encoding="utf-8"))
            assert isinstance(fx.get("request"), dict) and isinstance(fx.get("check"), dict) and fx.get("id")
        except (ValueError, AssertionError):
            # Kept, so that it fails in every cohort rather than silently dropping out.
            fx = {"id": f.stem, "broken": f"{f.name} is not a valid fixture"}
        out.append(fx)
    if only:
        keep = set(only.split(","))
        out = [fx for fx in out if fx["id"] in keep or fx["id"].split("_", 1)[0] in keep]
        if not out:
            raise SetupError(f"--only {only}: no such fixture")
    return out


def verdict(report: dict) -> None:
    per = {}
    for c in report["cohorts"]:
        for r in c["results"]:
            p = per.setdefault(r["fixture"], {"reference": 0, "candidate": 0, "reference_runs": 0,
                                              "candidate_runs": 0})
            p[c["role"] + "_runs"] += 1
            p[c["role"]] += 0 if r["ok"] else 1
    worse = [f for f, p in per.items() if p["candidate"] > p["reference"]]
    res_fail = sum(1 for c in report["cohorts"] for r in c["results"] if not r["resource_ok"])
    report["per_fixture"] = per
    report["fixtures_worse"] = worse
    report["resource_failures"] = res_fail
    complete = all(c["complete"] for c in report["cohorts"]) and len(report["cohorts"]) == 2 * report["cohorts_each"]
    report["verdict"] = ("pass" if not worse and not res_fail else "fail") if complete else "incomplete"


def write(report: dict, path: str) -> None:
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    os.replace(tmp, path)


def print_table(report: dict) -> None:
    n = report["cohorts_each"]
    print(f"\nqualify tasks: {report['model']}, {len(report['per_fixture'])} fixtures x {n} cohorts each; "
          f"reference {report['reference']['spec']!r}, candidate {report['candidate']['spec']!r}")
    print(f"{'fixture':36} {'ref fail':>9} {'cand fail':>10}")
    for fid, p in report["per_fixture"].items():
        mark = "  << worse" if fid in report["fixtures_worse"] else ""
        print(f"{fid:36} {p['reference']:>4}/{p['reference_runs']:<4} {p['candidate']:>5}/{p['candidate_runs']:<4}{mark}")
    tot = {r: sum(p[r] for p in report["per_fixture"].values()) for r in ("reference", "candidate")}
    print(f"{'total failures':36} {tot['reference']:>9} {tot['candidate']:>10}")
    if report["resource_failures"]:
        print(f"resource monitoring: {report['resource_failures']} request(s) over a bound")
    print(f"verdict: {report['verdict'].upper()} (bar: no fixture fails more often with the candidate"
          f"{', no request over a resource bound' if report['bounds'] else ''})")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mererun qualify tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="", help="catalog name or .gguf path (for the servers started here)")
    p.add_argument("--reference", default="draft=off", help="reference CONFIG (default: draft=off)")
    p.add_argument("--candidate", default="draft=ngram,k=auto", help="candidate CONFIG (default: the shipped drafting)")
    p.add_argument("--cohorts", type=int, default=3, help="cohorts per configuration")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--effort", default="high", choices=["low", "medium", "high", "max", "none"],
                   help="adaptive thinking at this effort; none: no thinking")
    p.add_argument("--ctx", type=int, default=8192, help="context of the servers started here")
    p.add_argument("--only", default="", help="comma list of fixture ids or numbers (a smoke run)")
    p.add_argument("--fixtures", default=str(HERE / "fixtures"))
    p.add_argument("--max-rss-mb", type=float, default=0, help="resource bound per request (server peak RSS)")
    p.add_argument("--max-kv-mb", type=float, default=0, help="resource bound per request (KV bytes)")
    p.add_argument("--json", default="")
    p.add_argument("--mererun", default=str(REPO / "build" / "bin" / "mererun"))
    p.add_argument("--serve-arg", action="append", default=[], help="extra `mererun serve` argument (repeatable)")
    a = p.parse_args(argv)
    if a.cohorts < 1 or a.max_tokens < 16:
        p.error("--cohorts >= 1 and --max-tokens >= 16")
    try:
        import anthropic
    except ImportError:
        print("mererun qualify tasks: the anthropic Python SDK is missing (pip install -r tests/requirements.txt)",
              file=sys.stderr)
        return 1
    servers = []
    report = {"schema": "mererun-qualify-tasks/1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "model": a.model, "cohorts_each": a.cohorts, "max_tokens": a.max_tokens, "effort": a.effort,
              "bounds": {k: v for k, v in (("max_rss_mb", a.max_rss_mb), ("max_kv_mb", a.max_kv_mb)) if v},
              "sdk": f"anthropic {anthropic.__version__}", "cohorts": [], "interrupted": False}
    stop = {"signal": 0}

    def on_signal(sig, _frame):
        stop["signal"] = sig
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        fixtures = load_fixtures(Path(a.fixtures), a.only)
        report["fixtures"] = [fx["id"] for fx in fixtures]
        cfgs = [parse_config(a.reference), parse_config(a.candidate)]
        if not all(c["url"] for c in cfgs):
            if not a.model:
                raise SetupError("-m MODEL is needed to start a server (or give url= configurations)")
            if not os.access(a.mererun, os.X_OK):
                raise SetupError(f"--mererun {a.mererun}: no executable there")
        for role, cfg in zip(("reference", "candidate"), cfgs):
            srv = Server(cfg, a.mererun, a.model, a.ctx, a.serve_arg)
            servers.append(srv)
            report[role] = {"spec": cfg["spec"], "url": srv.url, "identity": srv.health.get("identity", {}),
                            "environment": srv.health.get("environment", {})}
        if not a.model:
            report["model"] = servers[0].health.get("model", "")
        clients = [anthropic.Anthropic(base_url=s.url, api_key="any", max_retries=2, timeout=3600) for s in servers]
        for k in range(a.cohorts):
            for role_i, role in enumerate(("reference", "candidate")):
                cohort = {"role": role, "index": k, "results": [], "complete": False}
                report["cohorts"].append(cohort)
                for fx in fixtures:
                    if "broken" in fx:
                        rec = {"fixture": fx["id"], "ok": False, "reason": "could not be graded: " + fx["broken"],
                               "resource_ok": True, "resources": {}}
                    else:
                        rec = run_fixture(clients[role_i], fx, a)
                    cohort["results"].append(rec)
                    print(f"[tasks] {role:9} cohort {k + 1}/{a.cohorts} {fx['id']:32} "
                          f"{'pass' if rec['ok'] else 'FAIL: ' + rec['reason'][:100]}"
                          f"{'' if rec['resource_ok'] else ' [' + rec['resource_problem'] + ']'}", file=sys.stderr)
                    verdict(report)
                    write(report, a.json)
                cohort["complete"] = True
        verdict(report)
        write(report, a.json)
    except SetupError as e:
        print(f"mererun qualify tasks: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        report["interrupted"] = True
        verdict(report)
        write(report, a.json)
        print("mererun qualify tasks: interrupted; what was measured is in " + (a.json or "(no --json)"),
              file=sys.stderr)
        return 130
    finally:
        for s in servers:
            s.stop()
    print_table(report)
    return 0 if report["verdict"] == "pass" else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
