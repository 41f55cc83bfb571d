#!/usr/bin/env python3
"""Concurrent requests sharing one long prompt prefix: one OpenAI chat request with n=3 (greedy, 16
tokens) over a ~2,800-token prompt, against a server with the prefix cache (the first choice
prefills, the others wait and read the prefix from the cache) and one without (each choice
prefills). Prints one JSON line per configuration: wall time, prompt tokens evaluated (from
/metrics) and whether the three answers agree.

  python3 scripts/shared_prefill_bench.py [MODEL]   (default qwen2.5-coder-0.5b-instruct)
"""
import json, random, sys, time, urllib.request, re
from pathlib import Path
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from mererun_server import ServerProcess
model = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b-instruct"
WORDS = "the river carried stone and lantern light past the copper meadow while an orbit of velvet harbor signals drifted over maple quartz and ember falcons".split()
rng = random.Random(5)
doc = " ".join(rng.choice(WORDS) for _ in range(2600))
def run(args, label):
    s = ServerProcess(REPO / "build" / "bin" / "mererun", model, "-c", "8192", "-t", "2", *args)
    try:
        body = {"model": "m", "max_tokens": 16, "temperature": 0, "n": 3, "messages": [{"role": "user", "content": f"Read this.\n\n{doc}\n\nSummarize it."}]}
        t0 = time.time()
        r = json.load(urllib.request.urlopen(urllib.request.Request(s.base_url + "/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}), timeout=900))
        dt = time.time() - t0
        m = urllib.request.urlopen(s.base_url + "/metrics").read().decode()
        pre = float(re.search(r"^mererun_prefill_tokens_total (\S+)", m, re.M).group(1))
        print(json.dumps({"config": label, "model": model, "prompt_tokens": r["usage"]["prompt_tokens"], "wall_s": round(dt, 2), "prefill_tokens_computed": pre, "texts_equal": len({c["message"]["content"] for c in r["choices"]}) == 1}))
    finally:
        s.stop()
run([], "prefix cache on (shared prefill)")
run(["--prefix-cache-mb", "0"], "prefix cache off (each choice prefills)")
