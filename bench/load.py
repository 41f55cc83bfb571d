#!/usr/bin/env python3
"""Load program for a running `mererun serve` (issue 6): TTFT and inter-token latency
percentiles, request and token throughput at several concurrencies, with and without a shared
prompt prefix. Prints a table and writes JSON. Not a test: it measures.

  python3 bench/load.py --url http://127.0.0.1:8080 --concurrency 1,2,4,8 --requests 8 \
      --max-tokens 64 --json /tmp/load.json

Each request streams from POST /v1/messages; the time to the first text_delta is the TTFT and
the gaps between later deltas are inter-token latencies (one delta per token as mererun streams
them). "shared" prompts start with the same ~N-token preamble (a prefix cache can reuse it);
"distinct" prompts differ from their first words.
"""
import argparse
import concurrent.futures as cf
import json
import platform
import statistics
import subprocess
import sys
import time

import requests

WORDS = ("river stone lantern copper meadow orbit velvet harbor signal maple quartz ember "
         "falcon prism tundra cobalt willow beacon saddle glacier thunder orchid compass").split()


def preamble(n_words, salt):
    out = []
    for i in range(n_words):
        out.append(WORDS[(i * 7 + salt * 13 + i // 5) % len(WORDS)])
    return " ".join(out)


def make_prompt(shared, index, prefix_words):
    pre = preamble(prefix_words, 0 if shared else index + 1)
    return f"{pre}\n\nRequest {index}: write a short story about a {WORDS[index % len(WORDS)]}."


def one_request(url, headers, prompt, max_tokens, timeout):
    body = {"model": "mererun", "max_tokens": max_tokens, "stream": True, "temperature": 1.0,
            "messages": [{"role": "user", "content": prompt}]}
    t0 = time.perf_counter()
    times = []
    usage = {}
    error = None
    try:
        with requests.post(url + "/v1/messages", json=body, headers=headers, stream=True, timeout=timeout) as r:
            if r.status_code != 200:
                return {"ok": False, "status": r.status_code, "error": r.text[:200]}
            event = None
            for line in r.iter_lines(decode_unicode=True):
                if not line:
                    continue
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data = json.loads(line[5:])
                    if event == "content_block_delta":
                        times.append(time.perf_counter() - t0)
                    elif event == "message_start":
                        usage.update(data["message"].get("usage", {}))
                    elif event == "message_delta":
                        usage.update(data.get("usage", {}))
                    elif event == "error":
                        error = data
    except requests.RequestException as e:
        return {"ok": False, "status": 0, "error": str(e)}
    total = time.perf_counter() - t0
    if error:
        return {"ok": False, "status": 200, "error": json.dumps(error)[:200]}
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"ok": True, "ttft_s": times[0] if times else total, "itl_s": gaps, "total_s": total,
            "output_tokens": usage.get("output_tokens", len(times)), "input_tokens": usage.get("input_tokens"),
            "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0)}


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_level(args, headers, concurrency, shared):
    prompts = [make_prompt(shared, i, args.prefix_words) for i in range(args.requests)]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as ex:
        results = list(ex.map(lambda p: one_request(args.url, headers, p, args.max_tokens, args.timeout), prompts))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    itl = [g for r in ok for g in r["itl_s"]]
    out_tokens = sum(r["output_tokens"] for r in ok)
    return {
        "concurrency": concurrency, "shared_prefix": shared, "requests": len(results), "ok": len(ok),
        "errors": [r for r in results if not r["ok"]][:5], "wall_s": wall,
        "requests_per_s": len(ok) / wall, "output_tokens_per_s": out_tokens / wall,
        "ttft_s": {p: pct(ttft, p) for p in (50, 90, 99)},
        "itl_s": {p: pct(itl, p) for p in (50, 90, 99)},
        "cache_read_tokens": sum(r.get("cache_read_input_tokens") or 0 for r in ok),
        "samples": ok,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=8, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefix-words", type=int, default=600, help="words in the (shared or distinct) preamble")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    headers = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
    if args.api_key:
        headers["x-api-key"] = args.api_key
    try:
        health = requests.get(args.url + "/health", timeout=10).json()
    except Exception:  # /health may not exist on an older server
        health = None
    levels = []
    for shared in (True, False):
        for c in [int(x) for x in args.concurrency.split(",")]:
            levels.append(run_level(args, headers, c, shared))
            lv = levels[-1]
            print(f"  c={c} shared={shared}: {lv['ok']}/{lv['requests']} ok, {lv['output_tokens_per_s']:.1f} tok/s", file=sys.stderr)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    report = {"url": args.url, "commit": commit, "cpu": cpu, "machine": platform.machine(), "health": health,
              "max_tokens": args.max_tokens, "prefix_words": args.prefix_words, "levels": levels}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{'conc':>4} {'shared':>6} {'ok':>5} {'req/s':>7} {'tok/s':>7} {'ttft p50':>9} {'p90':>7} {'p99':>7} "
          f"{'itl p50':>8} {'p90':>7} {'p99':>7} {'cached':>7}")
    fmt = lambda x: f"{x:.3f}" if x is not None else "-"
    for lv in levels:
        print(f"{lv['concurrency']:>4} {str(lv['shared_prefix']):>6} {lv['ok']:>2}/{lv['requests']:<2} {lv['requests_per_s']:>7.2f} "
              f"{lv['output_tokens_per_s']:>7.1f} {fmt(lv['ttft_s'][50]):>9} {fmt(lv['ttft_s'][90]):>7} {fmt(lv['ttft_s'][99]):>7} "
              f"{fmt(lv['itl_s'][50]):>8} {fmt(lv['itl_s'][90]):>7} {fmt(lv['itl_s'][99]):>7} {lv['cache_read_tokens']:>7}")


if __name__ == "__main__":
    main()
