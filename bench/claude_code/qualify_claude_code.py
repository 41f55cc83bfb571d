#!/usr/bin/env python3
"""`mererun qualify claude-code`: a coding session of the pinned Claude Code (tools/claude-code,
print mode, its default tools, `--effort high`) against `mererun serve`, on the fixture repo in
bench/claude_code/fixture: two buggy modules and 10 visible tests. Three holdout tests
(bench/claude_code/holdout) are never in the session's directory; they are run afterwards on a
copy of what the session left.

A run PASSES when every holdout test passes and the tests and requirements.txt are unchanged.
Recorded per run: the client wall time (the server is loaded and warmed up before the clock
starts), the tool calls (by name), the turns, the stops at the output limit (assistant messages
that ended with stop_reason max_tokens), the server's resource figures, and the whole trace
(Claude Code's stream-json, one event per line) in --trace-dir.

Runs alternate between a reference and a candidate configuration (same CONFIG syntax as
`qualify tasks`), --runs each. The verdict: PASS when the candidate passes at least as many runs
as the reference. Exit: 0 PASS, 3 FAIL, 1 set-up error, 130 interrupted (results kept).

The session always runs in the same directory (--workdir), so Claude Code's ~12k-token prompt is
the same every run and the servers' shared KV disk cache (--cache-dir) makes every run but the
first start warm.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench" / "tasks"))
from qualify_tasks import Server, SetupError, health, parse_config  # noqa: E402

PROMPT = ("The tests in tests/ fail (run `python3 -m pytest -q`). Fix the bugs in the textstats package so "
          "that every test passes. The README describes the intended behaviour. Do not modify anything under "
          "tests/ or requirements.txt.")
PROTECTED = ("tests/test_words.py", "tests/test_money.py", "requirements.txt")


def digest(root: Path, rel: str) -> str:
    p = root / rel
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "(missing)"


def run_pytest(cwd: Path, *args: str) -> tuple[bool, str, dict]:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    passed = {ln.split()[1]: ln.startswith("PASSED") for ln in r.stdout.splitlines()
              if ln.startswith(("PASSED ", "FAILED ", "ERROR "))}
    return r.returncode == 0, r.stdout[-3000:], passed


def grade(work: Path, fixture: Path, holdout: Path) -> dict:
    """Holdout and visible tests on a copy of what the session left; protected files compared."""
    changed = [rel for rel in PROTECTED if digest(work, rel) != digest(fixture, rel)]
    with tempfile.TemporaryDirectory(prefix="mererun-grade-") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(work, copy, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", ".claude", ".git"))
        # The tests as shipped, whatever the session did to them, plus the holdout tests.
        for rel in PROTECTED:
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(fixture / rel, copy / rel)
        for f in holdout.glob("test_*.py"):
            shutil.copy(f, copy / "tests" / f.name)
        ok_h, out_h, per_h = run_pytest(copy, *[f"tests/{f.name}" for f in holdout.glob("test_*.py")])
        ok_v, _, per_v = run_pytest(copy, *[f"tests/{Path(rel).name}" for rel in PROTECTED[:2]])
    return {"pass": ok_h and not changed, "holdout_passed": sum(per_h.values()), "holdout_total": len(per_h),
            "visible_passed": sum(per_v.values()), "visible_total": len(per_v), "protected_changed": changed,
            "holdout_output": "" if ok_h else out_h}


def read_trace(path: Path) -> dict:
    tools, limit_stops, result, seen = [], set(), {}, set()
    for line in path.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("type") == "assistant":
            msg = ev.get("message", {})
            mid = msg.get("id") or len(seen)  # one event per content block of a message
            seen.add(mid)
            if msg.get("stop_reason") == "max_tokens":
                limit_stops.add(mid)
            tools += [b.get("name") for b in msg.get("content", []) if b.get("type") == "tool_use"]
        elif ev.get("type") == "result":
            result = ev
    return {"tool_calls": len(tools), "tools": tools, "assistant_messages": len(seen),
            "output_limit_stops": len(limit_stops),
            "num_turns": result.get("num_turns"), "is_error": result.get("is_error"),
            "result_subtype": result.get("subtype"), "final_text": (result.get("result") or "")[:1000]}


def server_resources(url: str) -> dict:
    """The server's resource maxima so far (/metrics; Claude Code streams, so the per-response
    headers are not there): process high-water mark, the largest per-request peak RSS and KV."""
    names = {"mererun_resident_memory_peak_bytes": "process_peak_rss_bytes",
             "mererun_request_resident_peak_bytes_max": "request_peak_rss_bytes_max",
             "mererun_request_kv_peak_bytes_max": "request_kv_peak_bytes_max"}
    out = {}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in names:
                    out[names[name]] = int(float(value))
    except OSError:
        pass
    return out


def session(claude: Path, server_url: str, work: Path, fixture: Path, a, trace: Path) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(fixture, work)
    # A developer's project is a git repository (Claude Code's prompt and its worktree-based
    # agents depend on it): one commit of the fixture, with fixed identity and dates, so the
    # prompt is the same every run.
    git_env = dict(os.environ, GIT_AUTHOR_NAME="fixture", GIT_AUTHOR_EMAIL="fixture@example.invalid",
                   GIT_COMMITTER_NAME="fixture", GIT_COMMITTER_EMAIL="fixture@example.invalid",
                   GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z")
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "textstats"]):
        subprocess.run(cmd, cwd=work, env=git_env, check=True, capture_output=True)
    home = work.parent / "home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = dict(os.environ, HOME=str(home), ANTHROPIC_BASE_URL=server_url, ANTHROPIC_API_KEY="any",
               DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", API_TIMEOUT_MS="3600000",
               DISABLE_AUTOUPDATER="1")
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    argv = [str(claude), "-p", a.prompt, "--output-format", "stream-json", "--verbose", "--effort", a.effort,
            "--max-turns", str(a.max_turns), "--allowedTools", "Read,Edit,Write,Bash,Glob,Grep", *a.claude_arg]
    t0 = time.time()
    with open(trace, "w") as out:
        try:
            proc = subprocess.run(argv, cwd=work, env=env, stdout=out, stderr=subprocess.PIPE, text=True,
                                  timeout=a.timeout)
            rc, err = proc.returncode, proc.stderr[-2000:]
        except subprocess.TimeoutExpired as e:
            rc, err = "timeout", (e.stderr or b"")[-2000:].decode(errors="replace") if e.stderr else ""
    wall = time.time() - t0
    rec = {"exit": rc, "wall_s": round(wall, 1), "stderr_tail": err, "trace": str(trace), **read_trace(trace)}
    rec.update(grade(work, fixture, HERE / "holdout"))
    return rec


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mererun qualify claude-code", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--reference", default="draft=off")
    p.add_argument("--candidate", default="draft=ngram,k=auto")
    p.add_argument("--runs", type=int, default=1, help="runs per configuration")
    p.add_argument("--only", choices=["reference", "candidate"], default=None, help="run one configuration only")
    p.add_argument("--max-turns", type=int, default=30)
    p.add_argument("--effort", default="high")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per session")
    p.add_argument("--ctx", type=int, default=32768)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--claude-arg", action="append", default=[], help="extra Claude Code argument (repeatable)")
    p.add_argument("--serve-arg", action="append", default=[], help="extra `mererun serve` argument (repeatable)")
    p.add_argument("--workdir", default="/tmp/mererun-qualify-claude-code/repo")
    p.add_argument("--cache-dir", default="", help="the servers' KV disk cache (default: $MERERUN_HOME/kv-cache-qualify-claude-code)")
    p.add_argument("--trace-dir", default="")
    p.add_argument("--max-rss-mb", type=float, default=0,
                   help="resource bound: a session during which a request's peak RSS went over it fails")
    p.add_argument("--json", default="")
    p.add_argument("--mererun", default=str(REPO / "build" / "bin" / "mererun"))
    p.add_argument("--claude", default=str(REPO / "tools" / "claude-code" / "node_modules" / ".bin" / "claude"))
    a = p.parse_args(argv)
    claude = Path(a.claude)
    fixture = HERE / "fixture"
    work = Path(a.workdir)
    home = os.environ.get("MERERUN_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mererun")
    cache_dir = a.cache_dir or str(Path(home) / "kv-cache-qualify-claude-code")
    trace_dir = Path(a.trace_dir or tempfile.mkdtemp(prefix="mererun-claude-code-traces-"))
    trace_dir.mkdir(parents=True, exist_ok=True)
    report = {"schema": "mererun-qualify-claude-code/1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "model": a.model, "prompt": a.prompt, "max_turns": a.max_turns, "effort": a.effort,
              "claude_args": a.claude_arg, "runs": [], "interrupted": False}

    def write():
        if a.json:
            tmp = a.json + ".tmp"
            Path(tmp).write_text(json.dumps(report, indent=1))
            os.replace(tmp, a.json)

    def on_signal(sig, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    servers = {}
    try:
        if not claude.exists():
            raise SetupError(f"Claude Code is not installed at {claude} (scripts/setup.sh: npm ci in tools/claude-code)")
        ver = subprocess.run([str(claude), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
        report["claude_code"] = ver
        roles = [r for r in ("reference", "candidate") if a.only in (None, r)]
        specs = {"reference": a.reference, "candidate": a.candidate}
        for role in roles:
            cfg = parse_config(specs[role])
            servers[role] = Server(cfg, a.mererun, a.model, a.ctx, ["--cache-dir", cache_dir, *a.serve_arg])
            report[role] = {"spec": cfg["spec"], "identity": servers[role].health.get("identity", {}),
                            "environment": servers[role].health.get("environment", {})}
        for k in range(a.runs):
            for role in roles:
                srv = servers[role]
                trace = trace_dir / f"{role}-{k + 1}.jsonl"
                print(f"[claude-code] {role} run {k + 1}/{a.runs} ...", file=sys.stderr, flush=True)
                rec = {"role": role, "run": k + 1, **session(claude, srv.url, work, fixture, a, trace)}
                _, hb = health(srv.url)
                rec["server_after"] = {"active": hb.get("active"), "queued": hb.get("queued"),
                                       **server_resources(srv.url)}
                peak = rec["server_after"].get("request_peak_rss_bytes_max", 0)
                rec["resource_ok"] = not a.max_rss_mb or peak <= a.max_rss_mb * 2**20
                if not rec["resource_ok"]:  # kept, and it fails the run
                    rec["resource_problem"] = f"peak RSS {peak / 2**20:.0f} MiB > {a.max_rss_mb} MiB"
                    rec["pass"] = False
                report["runs"].append(rec)
                print(f"[claude-code] {role} run {k + 1}: {'PASS' if rec['pass'] else 'FAIL'} — holdout "
                      f"{rec['holdout_passed']}/{rec['holdout_total']}, visible {rec['visible_passed']}/"
                      f"{rec['visible_total']}, {rec['tool_calls']} tool calls {rec['tools'][:12]}, "
                      f"{rec['output_limit_stops']} output-limit stops, {rec['wall_s']} s"
                      f"{', changed ' + str(rec['protected_changed']) if rec['protected_changed'] else ''}",
                      file=sys.stderr, flush=True)
                write()
    except SetupError as e:
        print(f"mererun qualify claude-code: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        report["interrupted"] = True
        write()
        return 130
    finally:
        for s in servers.values():
            s.stop()
    passes = {r: sum(x["pass"] for x in report["runs"] if x["role"] == r) for r in ("reference", "candidate")}
    report["passes"] = passes
    both = a.only is None
    report["verdict"] = ("pass" if passes["candidate"] >= passes["reference"] else "fail") if both else "single"
    write()
    print(f"\nqualify claude-code: {a.model}, {a.runs} run(s) per configuration ({report.get('claude_code')})")
    for r in report["runs"]:
        print(f"  {r['role']:9} run {r['run']}: {'PASS' if r['pass'] else 'FAIL'}  holdout {r['holdout_passed']}/"
              f"{r['holdout_total']}  visible {r['visible_passed']}/{r['visible_total']}  tool calls {r['tool_calls']}"
              f"  output-limit stops {r['output_limit_stops']}  {r['wall_s']} s")
    print(f"verdict: {report['verdict'].upper()}" + (" (bar: the candidate passes at least as many runs)" if both else ""))
    return 0 if report["verdict"] in ("pass", "single") else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
