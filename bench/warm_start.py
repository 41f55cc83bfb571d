#!/usr/bin/env python3
"""Warm-start TTFT through the prefix cache's disk tier (issue 14). Not a test: it measures,
prints a table and writes JSON (commit, CPU, threads, every sample).

For each model: a server with an empty --cache-dir answers Claude Code's first request (the
recorded 2.1.328 request in tests/e2e/fixtures, ~11.6k tokens on Qwen2.5-Coder; max_tokens 1,
no thinking) cold; the server stops and a new one on the same directory answers it again (the
disk tier's warm start); then the same server a third time (memory). TTFT here is the time to
the whole 1-token answer, so it includes the one decode step.

  python3 bench/warm_start.py -m qwen2.5-coder-0.5b-instruct --json bench/results/warm-start.json
"""
import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import OwnServer, environment, wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "e2e" / "fixtures" / "claude_code_2.1.328_request.json"


def ask(url, body):
    t0 = time.time()
    r = requests.post(url + "/v1/messages", json=body, timeout=3600,
                      headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    dt = time.time() - t0
    r.raise_for_status()
    u = r.json()["usage"]
    return {"seconds": dt, "input_tokens": u["input_tokens"], "cache_read": u.get("cache_read_input_tokens") or 0,
            "cache_creation": u.get("cache_creation_input_tokens") or 0}


def metrics(url):
    out = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("mererun_disk_cache_"):
            k, v = line.split()
            out[k] = float(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-c", "--ctx", type=int, default=32768)
    ap.add_argument("--bin", default=str(REPO / "build" / "bin" / "mererun"))
    ap.add_argument("--json")
    args = ap.parse_args()
    body = json.loads(FIXTURE.read_text())
    for k in ("thinking", "stream", "context_management", "output_config"):
        body.pop(k, None)
    body["max_tokens"] = 1
    body["temperature"] = 0
    report = {"env": environment(), "threads": args.threads, "ctx": args.ctx, "runs": []}
    for model in args.model:
        cache_dir = tempfile.mkdtemp(prefix="mererun-warm-start-")
        run = {"model": model}
        try:
            for phase in ("cold", "disk"):
                s = OwnServer(args.bin, model, args.threads, args.ctx, ["--cache-dir", cache_dir])
                try:
                    wait_ready(s.url)
                    run[phase] = ask(s.url, body)
                    if phase == "disk":
                        run["memory"] = ask(s.url, body)
                    time.sleep(1)
                    run[phase]["disk_after"] = metrics(s.url)
                finally:
                    s.stop()  # the engine writes what it has queued before it exits
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        report["runs"].append(run)
        print(json.dumps(run), flush=True)
    e = report["env"]
    print(f"\ncommit {e['commit'][:10]}{' (dirty)' if e['dirty'] else ''}, {e['cpu']}, {e['logical_cpus']} CPUs, "
          f"threads {args.threads or 'default'}")
    print(f"{'model':<32} {'prompt':>7} {'cold s':>8} {'disk s':>8} {'read':>7} {'memory s':>9} {'disk/cold':>9}")
    for r in report["runs"]:
        c, d, m = r["cold"], r["disk"], r["memory"]
        prompt = c["input_tokens"] + c["cache_read"] + c["cache_creation"]
        print(f"{r['model']:<32} {prompt:>7} {c['seconds']:>8.2f} {d['seconds']:>8.2f} {d['cache_read']:>7} "
              f"{m['seconds']:>9.2f} {d['seconds'] / c['seconds']:>9.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
