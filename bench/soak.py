#!/usr/bin/env python3
"""Soak program for `mererun serve` (hardening issue). Not a test: it measures, prints a table and
writes JSON (commit, CPU, server flags, every window).

For --seconds (default 600), --clients streaming clients (default 6: about 80 % of the default 8
sequence slots) loop over requests of mixed shape: prompts of different lengths from real text,
max_tokens 16..128, and one request in --cancel-every closed early by the client (so
cancellation paths run too). Every --sample-s seconds the server's resident memory is read from
/proc (or /metrics' mererun_resident_memory_bytes with --url). Per window of --window-s: requests,
errors, TTFT p50/p99 and request-latency p99, resident memory.

Reported: resident-memory drift = (mean RSS of the last window - mean RSS of the first window
after --warmup-s) / the latter (target: under 2 %), and the p99 latency of each window (stable:
the last window's p99 within 1.5x of the first's). Ends with /health showing no active or
queued sequence (nothing leaked).

  python3 bench/soak.py -m smollm2-135m-instruct --json bench/results/soak-smollm2.json
"""
import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import OwnServer, Prompts, environment, load_text, one_request, pct, wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def rss_bytes(pid, url):
    if pid:
        try:
            pages = int(open(f"/proc/{pid}/statm").read().split()[1])
            return pages * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return None
    try:
        for line in requests.get(url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("mererun_resident_memory_bytes "):
                return float(line.split()[1])
    except requests.RequestException:
        pass
    return None


def cancelled_request(url, prompt):
    """A stream the client closes after its first delta."""
    body = {"model": "m", "max_tokens": 256, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    try:
        with requests.post(url + "/v1/messages", json=body, stream=True, timeout=120) as r:
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("event: content_block_delta"):
                    break
    except requests.RequestException:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("--url", help="a running server (default: start build/bin/mererun serve)")
    ap.add_argument("--bin", default=str(REPO / "build" / "bin" / "mererun"))
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--warmup-s", type=float, default=60)
    ap.add_argument("--window-s", type=float, default=60)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--cancel-every", type=int, default=10)
    ap.add_argument("--text-dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    server = None
    if args.url:
        url, pid = args.url.rstrip("/"), None
    else:
        server = OwnServer(args.bin, args.model, args.threads, args.ctx, args.server_arg)
        url, pid = server.url, server.proc.pid
    try:
        wait_ready(url)
        prompts = Prompts(url, {}, load_text(args.text_dir)[0])
        env = environment()
        t_start = time.time()
        stop = threading.Event()
        samples, requests_log = [], []
        lock = threading.Lock()

        def sampler():
            while not stop.is_set():
                samples.append((time.time() - t_start, rss_bytes(pid, url)))
                stop.wait(args.sample_s)

        def client(i):
            rng = random.Random(args.seed * 1000 + i)
            n = 0
            while not stop.is_set():
                n += 1
                tokens = rng.choice([40, 150, 600, 1500])
                prompt = prompts.window(tokens, rng.randrange(10_000)) + "\n\nSummarize the passage above."
                t0 = time.time() - t_start
                if n % args.cancel_every == 0:
                    cancelled_request(url, prompt)
                    r = {"ok": True, "cancelled": True, "total_s": time.time() - t_start - t0}
                else:
                    r = one_request(url, {}, prompt, rng.randint(16, 128), 1.0, 300)
                r["t"] = t0
                with lock:
                    requests_log.append(r)

        threads = [threading.Thread(target=sampler)] + [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        health = wait_ready(url) or {}
        deadline = time.time() + 30
        while time.time() < deadline and (health.get("active") or health.get("queued")):
            time.sleep(0.5)
            health = requests.get(url + "/health", timeout=5).json()

        windows = []
        w0 = args.warmup_s
        while w0 + args.window_s <= args.seconds + 1e-6:
            w1 = w0 + args.window_s
            rs = [r for r in requests_log if w0 <= r["t"] < w1]
            done = [r for r in rs if r.get("ok") and not r.get("cancelled")]
            rss = [b for t, b in samples if w0 <= t < w1 and b]
            windows.append({"start_s": w0, "requests": len(rs), "errors": sum(1 for r in rs if not r.get("ok")),
                            "ttft_p50_s": pct([r["ttft_s"] for r in done], 50),
                            "ttft_p99_s": pct([r["ttft_s"] for r in done], 99),
                            "latency_p99_s": pct([r["total_s"] for r in done], 99),
                            "rss_mean_bytes": sum(rss) / len(rss) if rss else None})
            w0 = w1
        first, last = (windows[0], windows[-1]) if windows else ({}, {})
        drift = ((last["rss_mean_bytes"] - first["rss_mean_bytes"]) / first["rss_mean_bytes"]
                 if windows and first.get("rss_mean_bytes") and last.get("rss_mean_bytes") else None)
        p99_ratio = (last["latency_p99_s"] / first["latency_p99_s"]
                     if windows and first.get("latency_p99_s") and last.get("latency_p99_s") else None)
        report = {"environment": env, "model": args.model, "url": url, "server_args": args.server_arg,
                  "seconds": args.seconds, "clients": args.clients, "windows": windows,
                  "rss_drift": drift, "latency_p99_last_over_first": p99_ratio,
                  "requests": len(requests_log), "errors": sum(1 for r in requests_log if not r.get("ok")),
                  "final_health": health, "rss_samples": samples}
        print(f"soak: {args.model}, {args.clients} clients, {args.seconds:.0f} s, CPU {env['cpu']}, commit {env['commit'][:10]}")
        print(f"{'window':>8} {'reqs':>5} {'errs':>5} {'ttft p50':>9} {'ttft p99':>9} {'lat p99':>9} {'RSS MiB':>9}")
        for w in windows:
            f = lambda x: f"{x:9.3f}" if x is not None else f"{'-':>9}"
            rss = f"{w['rss_mean_bytes'] / 2**20:9.1f}" if w["rss_mean_bytes"] else f"{'-':>9}"
            print(f"{w['start_s']:8.0f} {w['requests']:5d} {w['errors']:5d} {f(w['ttft_p50_s'])} {f(w['ttft_p99_s'])} "
                  f"{f(w['latency_p99_s'])} {rss}")
        print(f"RSS drift first→last window: {drift * 100:+.2f} %" if drift is not None else "RSS drift: n/a")
        print(f"p99 latency last/first window: {p99_ratio:.2f}" if p99_ratio else "p99 ratio: n/a")
        print(f"requests {report['requests']}, errors {report['errors']}, final /health {health}")
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()
