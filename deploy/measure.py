#!/usr/bin/env python3
"""Measures the replicated deployment (deploy/cluster.py) on loopback, through the official
Anthropic Python SDK, and prints JSON plus a table:

  1. affinity vs round-robin: CONVERSATIONS multi-turn conversations with shared system prompts
     through the affinity frontend, then as many fresh ones through the round-robin frontend
     over the same replicas; per follow-up turn, whether it read any prefix from cache
     (cache_read_input_tokens > 0) and whether it read its own conversation so far (at least the
     previous turn's prompt, less one 128-token cache block);
  2. replica loss: a replica is SIGKILLed while requests are in flight; which requests failed
     (from HAProxy's log: only that replica's), whether the SDK's retries then succeeded, and
     whether conversations of the other replicas stayed where they were (consistent hashing);
  3. rolling restart of every replica under load: requests lost (must be none);
  4. a replica restarted with another configuration on the same port: HAProxy's identity check
     keeps it out, and no request reaches it.

    python3 deploy/measure.py --json bench/results/deploy.json            # starts its own cluster
    python3 deploy/measure.py --conversations 9 --turns 3 --quick         # the CI-sized run

Exit status 1 when a bar is missed (>= 90 % own-prefix hits with affinity, no lost request on
replica loss or rolling restart, the mismatched replica never used), 2 on a set-up error.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster as cl  # noqa: E402

WORDS = ("alpha beta gamma delta kernel buffer socket thread queue token cache model replica vector matrix "
         "parser router server client header stream window prefix suffix engine driver module packet frame "
         "record ledger harbor river mountain garden lantern copper silver timber canvas marble meadow").split()


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def system_prompt(k: int, tag: str) -> str:
    rng = random.Random(1000 + k)
    return (f"You are assistant {tag}-{k} for a team. Answer briefly. Reference notes follow.\n" +
            "\n".join(f"Note {i}: {text(rng, 24)}." for i in range(12)))


class Recorder:
    """Every HTTP attempt the SDK makes (its retries included): status and answering replica."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts: list[dict] = []

    def hook(self, response) -> None:
        with self.lock:
            self.attempts.append({"t": time.time(), "status": response.status_code,
                                  "replica": response.headers.get("x-mererun-replica", ""),
                                  "conv": response.request.headers.get("x-conv", "")})

    def client(self, base_url: str, max_retries: int = 2) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=base_url, api_key="any", max_retries=max_retries,
                                   http_client=anthropic.DefaultHttpxClient(event_hooks={"response": [self.hook]},
                                                                                      timeout=600))


def run_conversation(client: anthropic.Anthropic, conv_id: str, system: str, turns: int, max_tokens: int,
                     seed: int) -> list[dict]:
    rng = random.Random(seed)
    messages: list[dict] = []
    out = []
    for t in range(turns):
        user = (f"Conversation {conv_id}. " + text(rng, 280)) if t == 0 else ("Follow-up: " + text(rng, 60))
        messages.append({"role": "user", "content": user})
        t0 = time.time()
        rec = {"conv": conv_id, "turn": t, "ok": False}
        try:
            raw = client.messages.with_raw_response.create(model="m", max_tokens=max_tokens, system=system,
                                                           messages=messages, extra_headers={"x-conv": conv_id})
            msg = raw.parse()
            u = msg.usage
            rec.update(ok=True, replica=raw.headers.get("x-mererun-replica", ""), seconds=time.time() - t0,
                       input=u.input_tokens, cache_read=u.cache_read_input_tokens or 0,
                       cache_creation=u.cache_creation_input_tokens or 0, output=u.output_tokens)
            reply = "".join(b.text for b in msg.content if b.type == "text") or "(empty)"
        except anthropic.APIError as e:
            rec.update(error=f"{type(e).__name__}: {str(e)[:200]}", seconds=time.time() - t0)
            reply = "(error)"
        out.append(rec)
        if not rec["ok"]:
            break
        messages.append({"role": "assistant", "content": reply})
    return out


def run_cohort(base_url: str, rec: Recorder, tag: str, n_conv: int, turns: int, max_tokens: int,
               concurrency: int, n_systems: int = 3) -> list[list[dict]]:
    client = rec.client(base_url)
    with ThreadPoolExecutor(concurrency) as pool:
        futs = [pool.submit(run_conversation, client, f"{tag}{i}", system_prompt(i % n_systems, tag), turns,
                            max_tokens, 7919 * i + sum(map(ord, tag))) for i in range(n_conv)]
        return [f.result() for f in futs]


def hit_stats(convs: list[list[dict]]) -> dict:
    follow = any_hit = own_hit = 0
    read_frac = []
    per_replica: dict[str, int] = {}
    for conv in convs:
        if conv and conv[0].get("ok"):
            per_replica[conv[0]["replica"]] = per_replica.get(conv[0]["replica"], 0) + 1
        for prev, cur in zip(conv, conv[1:]):
            if not (prev.get("ok") and cur.get("ok")):
                continue
            follow += 1
            prev_prompt = prev["input"] + prev["cache_read"] + prev["cache_creation"]
            prompt = cur["input"] + cur["cache_read"] + cur["cache_creation"]
            any_hit += cur["cache_read"] > 0
            own_hit += cur["cache_read"] >= prev_prompt - 128
            read_frac.append(cur["cache_read"] / max(1, prompt))
    lat = sorted(r["seconds"] for c in convs for r in c[1:] if r.get("ok"))
    return {"conversations": len(convs), "follow_up_turns": follow,
            "any_prefix_hit_rate": any_hit / max(1, follow), "own_prefix_hit_rate": own_hit / max(1, follow),
            "mean_prompt_fraction_read": sum(read_frac) / max(1, len(read_frac)),
            "follow_up_latency_median_s": lat[len(lat) // 2] if lat else None,
            "conversations_per_replica": dict(sorted(per_replica.items())),
            "failed_requests": sum(1 for c in convs for r in c if not r.get("ok"))}


def haproxy_log_since(path: Path, offset: int) -> list[dict]:
    """HAProxy httplog lines written after `offset`: server and status of each request."""
    out = []
    with open(path, "rb") as f:
        f.seek(offset)
        for ln in f.read().decode(errors="replace").splitlines():
            m = re.search(r"\] (\S+) (\S+)/(\S+) \S+ (-?\d+) .*\"(\S+) (\S+)", ln)
            if m:
                out.append({"frontend": m.group(1), "server": m.group(3), "status": int(m.group(4)),
                            "path": m.group(6)})
    return out


def phase_loss(c: cl.Cluster, base_url: str, victim: int, n_conv: int, max_tokens: int) -> dict:
    """Turn 1 of each conversation maps it to a replica; turn 2 runs with the victim killed
    while its requests are in flight."""
    rec = Recorder()
    client = rec.client(base_url)
    rng = random.Random(7)
    systems = [system_prompt(k, "L") for k in range(3)]
    convs = {f"L{i}": [{"role": "user", "content": f"Conversation L{i}. " + text(rng, 80)}] for i in range(n_conv)}
    home = {}
    for cid, msgs in convs.items():
        raw = client.messages.with_raw_response.create(model="m", max_tokens=8, system=systems[int(cid[1:]) % 3],
                                                       messages=msgs)
        home[cid] = raw.headers.get("x-mererun-replica", "")
        msgs += [{"role": "assistant", "content": "".join(b.text for b in raw.parse().content
                                                          if b.type == "text") or "ok"},
                 {"role": "user", "content": "Now write a long, detailed answer about " + text(rng, 12)}]
    log_path = c.dir / "haproxy.log"
    offset = log_path.stat().st_size
    results: dict[str, dict] = {}

    def turn2(cid):
        t0 = time.time()
        try:
            raw = client.messages.with_raw_response.create(model="m", max_tokens=max_tokens,
                                                           system=systems[int(cid[1:]) % 3], messages=convs[cid],
                                                           extra_headers={"x-conv": cid})
            raw.parse()
            results[cid] = {"ok": True, "replica": raw.headers.get("x-mererun-replica", ""),
                            "seconds": time.time() - t0}
        except anthropic.APIError as e:
            results[cid] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}

    victim_name = f"r{victim}"
    with ThreadPoolExecutor(n_conv) as pool:
        futs = [pool.submit(turn2, cid) for cid in convs]
        # Kill once the victim has requests in flight (or after 3 s).
        deadline = time.time() + 3
        while time.time() < deadline:
            if int(cl.server_states(c.socket).get(victim_name, {}).get("scur", "0") or 0) > 0:
                break
            time.sleep(0.02)
        in_flight = int(cl.server_states(c.socket).get(victim_name, {}).get("scur", "0") or 0)
        t_kill = time.time()
        c.kill(victim, signal.SIGKILL)
        for f in futs:
            f.result()
    time.sleep(0.5)  # let HAProxy write the last log lines
    log = [e for e in haproxy_log_since(log_path, offset) if e["frontend"] == "mererun"]
    failed_attempts = [e for e in log if e["status"] >= 500 or e["status"] < 0]
    moved_other = sum(1 for cid, r in results.items()
                      if home[cid] != victim_name and r.get("ok") and r["replica"] != home[cid])
    on_victim = [cid for cid in convs if home[cid] == victim_name]
    return {"victim": victim_name, "in_flight_on_victim_at_kill": in_flight,
            "conversations": n_conv, "conversations_on_victim": len(on_victim),
            "requests_failed_after_sdk_retries": sum(1 for r in results.values() if not r["ok"]),
            "failed_attempts": len(failed_attempts),
            "failed_attempts_not_on_victim": sum(1 for e in failed_attempts if e["server"] != victim_name),
            "victim_requests_retried_elsewhere_ok": sum(1 for cid in on_victim if results[cid].get("ok")
                                                        and results[cid]["replica"] != victim_name),
            "other_conversations_moved": moved_other,
            "kill_at_s": t_kill,
            "errors": [r["error"] for r in results.values() if not r["ok"]][:5]}


def phase_rolling(c: cl.Cluster, base_url: str, n_conv: int, turns: int, max_tokens: int) -> dict:
    rec = Recorder()
    done = threading.Event()
    convs: list[list[dict]] = []

    def load():
        while not done.is_set():
            convs.extend(run_cohort(base_url, rec, f"R{len(convs)}-", n_conv, turns, max_tokens, 3))

    t = threading.Thread(target=load)
    t.start()
    time.sleep(1.0)
    t0 = time.time()
    c.rolling_restart(log=lambda s: None)
    restart_s = time.time() - t0
    done.set()
    t.join()
    reqs = [r for conv in convs for r in conv]
    return {"restart_seconds": restart_s, "requests": len(reqs),
            "requests_failed": sum(1 for r in reqs if not r.get("ok")),
            "attempts_not_200": sum(1 for a in rec.attempts if a["status"] != 200),
            "errors": [r["error"] for r in reqs if not r.get("ok")][:5]}


def phase_mismatch(c: cl.Cluster, base_url: str, index: int, mererun: str) -> dict:
    """Replace a replica with the same model under another context size on its own port."""
    rep = c.replica(index)
    c.stop_replica(rep)
    argv = [mererun, "serve", "-m", c.state["model"], "--host", "127.0.0.1", "--port", str(rep["port"]), "-t", "1",
            "-c", "1024", "--cache-dir", str(c.dir / "mismatch-kv")]
    log = open(c.dir / "mismatch.log", "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rep_state = {"pid": proc.pid, "index": index, "port": rep["port"], "log": str(c.dir / "mismatch.log")}
        body = c.wait_replica_ready(rep_state, 120)
        deadline = time.time() + 15
        st = {}
        while time.time() < deadline:
            st = cl.server_states(c.socket).get(f"r{index}", {})
            # DOWN because the new process answers the identity check with 409, not merely
            # because the old one's port was closed for a moment.
            if st.get("status") == "DOWN" and st.get("check_code") == "409":
                break
            time.sleep(0.2)
        code, hb = cl.health(rep["port"], c.state["identity"])
        rec = Recorder()
        client = rec.client(base_url)
        served = []
        for i in range(12):
            raw = client.messages.with_raw_response.create(
                model="m", max_tokens=4, messages=[{"role": "user", "content": f"mismatch probe {i} " + "x" * i}])
            served.append(raw.headers.get("x-mererun-replica", ""))
        return {"replaced": f"r{index}", "its_identity": body.get("identity_hash"),
                "cluster_identity": c.state["identity"], "haproxy_status": st.get("status"),
                "haproxy_check_code": st.get("check_code"), "health_check_answer": code,
                "health_check_error": hb.get("error", ""), "requests": len(served),
                "requests_on_mismatched": served.count(f"r{index}")}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--conversations", type=int, default=30)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--port", type=int, default=18480)
    p.add_argument("--state-dir", default="")
    p.add_argument("--mererun", default=str(cl.REPO / "build" / "bin" / "mererun"))
    p.add_argument("--json", default="")
    p.add_argument("--quick", action="store_true", help="smaller loss and rolling-restart phases (CI)")
    a = p.parse_args(argv)
    state_dir = Path(a.state_dir) if a.state_dir else cl.default_state_dir() / f"measure-{os.getpid()}"
    c = cl.Cluster(state_dir)
    c.state = {}
    start = argparse.Namespace(replicas=a.replicas, model=a.model, port=a.port, first_replica_port=a.port + 1,
                               compare_port=a.port + 50, threads=0, mererun=a.mererun, haproxy="haproxy",
                               ready_timeout=300, serve_args=[])
    try:
        c.start(start)
    except cl.DeployError as e:
        print(f"measure.py: {e}", file=sys.stderr)
        return 2
    lb = f"http://127.0.0.1:{a.port}"
    rr = f"http://127.0.0.1:{a.port + 50}"
    result: dict = {"cpu": cpu_name(), "cores": os.cpu_count(), "replicas": a.replicas,
                    "model": a.model, "identity": c.state["identity"], "commit": commit(),
                    "conversations": a.conversations, "turns": a.turns, "max_tokens": a.max_tokens,
                    "concurrency": a.concurrency}
    try:
        rec = Recorder()
        t0 = time.time()
        result["affinity"] = hit_stats(run_cohort(lb, rec, "A", a.conversations, a.turns, a.max_tokens,
                                                  a.concurrency))
        result["affinity"]["seconds"] = time.time() - t0
        t0 = time.time()
        result["round_robin"] = hit_stats(run_cohort(rr, rec, "B", a.conversations, a.turns, a.max_tokens,
                                                     a.concurrency))
        result["round_robin"]["seconds"] = time.time() - t0
        n_small = 9 if a.quick else 18
        result["replica_loss"] = phase_loss(c, lb, 2, n_small, 96)
        c.revive(2)
        result["rolling_restart"] = phase_rolling(c, lb, 6 if a.quick else 12, 3, a.max_tokens)
        result["identity_mismatch"] = phase_mismatch(c, lb, a.replicas, a.mererun)
        c.revive(a.replicas)
    finally:
        c.stop()
    af, rl, rs, im = result["affinity"], result["replica_loss"], result["rolling_restart"], result["identity_mismatch"]
    bars = {
        "affinity_own_prefix_hits_ge_90pct": af["own_prefix_hit_rate"] >= 0.90,
        "no_request_lost_on_replica_loss": rl["requests_failed_after_sdk_retries"] == 0,
        "failures_only_on_killed_replica": rl["failed_attempts_not_on_victim"] == 0,
        "no_request_lost_in_rolling_restart": rs["requests_failed"] == 0,
        "mismatched_replica_kept_out": im["requests_on_mismatched"] == 0 and im["haproxy_status"] == "DOWN",
    }
    result["bars"] = bars
    result["verdict"] = "PASS" if all(bars.values()) else "FAIL"
    print_table(result)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0 if result["verdict"] == "PASS" else 1


def cpu_name() -> str:
    try:
        for ln in open("/proc/cpuinfo"):
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(cl.REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "?"


def print_table(r: dict) -> None:
    af, rr = r["affinity"], r["round_robin"]
    print(f"\n{r['replicas']} x {r['model']} behind haproxy ({r['cpu']}, {r['cores']} cores, commit {r['commit']})")
    print(f"{'':28} {'affinity':>10} {'round-robin':>12}")
    for k, label in (("follow_up_turns", "follow-up turns"), ("any_prefix_hit_rate", "read any prefix (>0)"),
                     ("own_prefix_hit_rate", "read own conversation"),
                     ("mean_prompt_fraction_read", "prompt fraction from cache"),
                     ("follow_up_latency_median_s", "median follow-up latency s"),
                     ("failed_requests", "failed requests")):
        a, b = af[k], rr[k]
        fmt = (lambda v: f"{v:.3f}") if isinstance(a, float) else str
        print(f"{label:28} {fmt(a):>10} {fmt(b):>12}")
    print(f"conversations per replica: affinity {af['conversations_per_replica']}, "
          f"round-robin {rr['conversations_per_replica']}")
    rl, rs, im = r["replica_loss"], r["rolling_restart"], r["identity_mismatch"]
    print(f"replica loss ({rl['victim']} SIGKILLed, {rl['in_flight_on_victim_at_kill']} in flight): "
          f"{rl['failed_attempts']} failed attempts ({rl['failed_attempts_not_on_victim']} elsewhere), "
          f"{rl['requests_failed_after_sdk_retries']} requests lost after SDK retries, "
          f"{rl['victim_requests_retried_elsewhere_ok']}/{rl['conversations_on_victim']} of its conversations "
          f"answered elsewhere, {rl['other_conversations_moved']} other conversations moved")
    print(f"rolling restart ({rs['restart_seconds']:.1f} s): {rs['requests']} requests, {rs['requests_failed']} lost, "
          f"{rs['attempts_not_200']} attempts not 200")
    print(f"identity mismatch: {im['replaced']} as {im['its_identity']} vs {im['cluster_identity']}: haproxy "
          f"{im['haproxy_status']} (check {im['haproxy_check_code']}), {im['requests_on_mismatched']}/"
          f"{im['requests']} requests reached it")
    print(f"verdict: {r['verdict']} {r['bars']}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
