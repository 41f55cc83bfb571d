"""Replicas behind HAProxy (deploy/): the loopback deployment through the real binary, real
HAProxy (Debian) and the official SDKs, and the Kubernetes manifests against the API schemas.
docs/deploy.md records the full-size figures (deploy/measure.py with its defaults)."""
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "deploy" / "cluster.py"
MEASURE = REPO / "deploy" / "measure.py"
K8S = REPO / "deploy" / "k8s"
MODEL = "smollm2-135m-instruct"


def free_base_port(n: int) -> int:
    """A port p with p .. p + n all free on 127.0.0.1."""
    for _ in range(200):
        base = random.randint(20000, 50000)
        ok = True
        for p in range(base, base + n + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def cluster(state_dir, *args, timeout=300):
    return subprocess.run([sys.executable, str(CLUSTER), "--state-dir", str(state_dir), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- Kubernetes manifests and the HAProxy configuration ----------------------------------


def test_k8s_manifests_validate_and_are_current(tmp_path):
    render = subprocess.run([sys.executable, str(K8S / "render.py"), "--check"], capture_output=True, text=True)
    assert render.returncode == 0, render.stderr
    files = [K8S / "mererun.yaml", K8S / "haproxy.yaml"]
    v = subprocess.run(["kubernetes-validate", "--strict", *map(str, files)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    kinds = sorted(d["kind"] for f in files for d in yaml.safe_load_all(f.read_text()))
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Namespace", "Service", "Service", "StatefulSet"]
    # The validator does reject a broken manifest (so the check above can fail).
    bad = tmp_path / "bad.yaml"
    bad.write_text((K8S / "mererun.yaml").read_text().replace("replicas: 3", "replicas: three"))
    v = subprocess.run(["kubernetes-validate", "--strict", str(bad)], capture_output=True, text=True)
    assert v.returncode != 0 and "replicas" in v.stdout + v.stderr

    # The ConfigMap's haproxy.cfg and Lua pass HAProxy's own check, with and without an identity.
    cm = next(d for d in yaml.safe_load_all((K8S / "haproxy.yaml").read_text()) if d["kind"] == "ConfigMap")
    assert cm["data"]["affinity.lua"] == (REPO / "deploy" / "haproxy" / "affinity.lua").read_text()
    (tmp_path / "affinity.lua").write_text(cm["data"]["affinity.lua"])
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(cm["data"]["haproxy.cfg"].replace("/usr/local/etc/haproxy", str(tmp_path)))
    for ident in ("", "0123456789abcdef"):
        c = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True,
                           env={**os.environ, "REPLICA_IDENTITY": ident})
        assert c.returncode == 0, c.stdout + c.stderr
    cfg.write_text(cfg.read_text().replace("balance hash var(txn.affinity)", "balance hash-nonsense"))
    assert subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True).returncode != 0


# --- the start script's errors ---------------------------------------------------------------


def test_start_script_gives_clear_errors(tmp_path, mererun_bin):
    r = cluster(tmp_path / "a", "start", "--port", "70000", "--mererun", mererun_bin)
    assert r.returncode == 2 and "70000 is not a TCP port" in r.stderr, r.stderr
    r = cluster(tmp_path / "b", "start", "--mererun", "/nonexistent/mererun")
    assert r.returncode == 2 and "/nonexistent/mererun: no executable" in r.stderr, r.stderr
    base = free_base_port(4)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 2))  # the second replica's port
        busy.listen()
        r = cluster(tmp_path / "c", "start", "--port", base, "--mererun", mererun_bin)
        assert r.returncode == 2 and f"{base + 2} is not free" in r.stderr, r.stderr
    # A model that does not exist: the replica's own error comes through, nothing stays up.
    r = cluster(tmp_path / "d", "start", "--port", base, "--replicas", 2, "--model", "no-such-model",
                "--mererun", mererun_bin, timeout=120)
    assert r.returncode == 2 and "exited during start-up" in r.stderr and "no-such-model" in r.stderr, r.stderr
    time.sleep(0.5)
    assert not any(listening(p) for p in range(base, base + 3))
    r = cluster(tmp_path / "e", "status")
    assert r.returncode == 2 and "no cluster state" in r.stderr


# --- affinity keys through the real load balancer -------------------------------------------


@pytest.fixture(scope="module")
def lb(tmp_path_factory, mererun_bin, model_path):
    model_path(MODEL)
    state = tmp_path_factory.mktemp("cluster")
    base = free_base_port(4)
    r = cluster(state, "start", "--replicas", 3, "--port", base, "--mererun", mererun_bin, "--model", MODEL)
    assert r.returncode == 0, r.stdout + r.stderr
    yield f"http://127.0.0.1:{base}", state
    cluster(state, "stop", timeout=120)


def replica_of(resp) -> str:
    assert resp.status_code == 200, resp.text
    name = resp.headers.get("x-mererun-replica", "")
    assert name in ("r1", "r2", "r3"), resp.headers
    return name


def test_session_header_and_prompt_prefix_pick_the_replica(lb):
    url, _ = lb
    count = url + "/v1/messages/count_tokens"
    # Claude Code's session header decides, whatever the body says.
    for sid in ("a07576f2-590e-434c-9f50-80c8e461fb00", "session-two"):
        got = {replica_of(requests.post(count, headers={"X-Claude-Code-Session-Id": sid},
                                        json={"model": "m", "messages": [{"role": "user", "content": f"turn {i}"}]}))
               for i in range(6)}
        assert len(got) == 1, got
    spread = {replica_of(requests.post(count, headers={"X-Claude-Code-Session-Id": f"s{i}"},
                                       json={"model": "m", "messages": [{"role": "user", "content": "x"}]}))
              for i in range(24)}
    assert len(spread) == 3, spread

    # Without it: the leading part (system, tools, messages up to the first user turn) decides,
    # whatever comes after it or how the other fields change between turns.
    tools = [{"name": "get_weather", "description": "w", "input_schema": {"type": "object", "properties": {}}}]
    homes = set()
    for conv in range(12):
        first = {"role": "user", "content": f"conversation {conv}: hello"}
        turns = [[first],
                 [first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}],
                 [first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"},
                  {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and more " * 50}]]
        got = {replica_of(requests.post(count, json={"model": "m", "max_tokens": 10 + i, "system": "shared system",
                                                     "tools": tools, "messages": m}))
               for i, m in enumerate(turns)}
        assert len(got) == 1, (conv, got)
        homes |= got
        # OpenAI: the system message and the first user message lead.
        chat = [{"role": "system", "content": "shared"}, {"role": "user", "content": f"conversation {conv}"}]
        got = {replica_of(requests.post(url + "/v1/chat/completions",
                                        json={"model": "m", "max_tokens": 1, "messages": m}))
               for m in (chat, chat + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}])}
        assert len(got) == 1, (conv, got)
    assert len(homes) >= 2, "12 conversations all on one replica: the key is not the conversation's"
    # Hostile bodies never break the balancer: each is answered (400 from a replica).
    for body in (b"[" * 100000, b'{"messages":[{"role":"user","content":"\\', b"\xff\xfe", b'{"system":' + b"{" * 5000):
        r = requests.post(url + "/v1/messages", data=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (body[:20], r.status_code, r.text[:200])
    assert requests.get(url + "/lb-health").text == "ok"


def test_health_identity_check(lb):
    _, state = lb
    st = json.loads((state / "state.json").read_text())
    port = st["replicas"][0]["port"]
    h = requests.get(f"http://127.0.0.1:{port}/health").json()
    assert h["identity_hash"] == st["identity"] and h["identity"]["model"] == MODEL
    assert len(h["identity"]["file_digest"]) == 64
    assert requests.get(f"http://127.0.0.1:{port}/health?identity={st['identity']}").status_code == 200
    r = requests.get(f"http://127.0.0.1:{port}/health?identity=0000000000000000")
    assert r.status_code == 409 and r.json()["status"] == "identity_mismatch"
    assert st["identity"] in r.json()["error"] and "0000000000000000" in r.json()["error"]


# --- the measured scenario, CI-sized ----------------------------------------------------------


@pytest.mark.slow
def test_affinity_loss_rolling_restart_and_mismatch(tmp_path, mererun_bin, model_path):
    """deploy/measure.py at a third of its default size: affinity vs round-robin, a replica
    SIGKILLed mid-run, a rolling restart under load, a replica with another configuration."""
    model_path(MODEL)
    out = tmp_path / "deploy.json"
    base = free_base_port(60)
    r = subprocess.run([sys.executable, str(MEASURE), "--conversations", "9", "--turns", "3", "--quick",
                        "--port", str(base), "--state-dir", str(tmp_path / "state"), "--mererun", str(mererun_bin),
                        "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    af, rr = res["affinity"], res["round_robin"]
    assert af["follow_up_turns"] == 18 and af["failed_requests"] == 0 and rr["failed_requests"] == 0
    assert af["own_prefix_hit_rate"] >= 0.9, af
    assert rr["own_prefix_hit_rate"] < af["own_prefix_hit_rate"], (af, rr)
    loss = res["replica_loss"]
    assert loss["requests_failed_after_sdk_retries"] == 0, loss
    assert loss["failed_attempts_not_on_victim"] == 0, loss
    assert loss["other_conversations_moved"] == 0, loss
    assert loss["victim_requests_retried_elsewhere_ok"] == loss["conversations_on_victim"], loss
    roll = res["rolling_restart"]
    assert roll["requests"] > 0 and roll["requests_failed"] == 0, roll
    mm = res["identity_mismatch"]
    assert mm["haproxy_status"] == "DOWN" and mm["haproxy_check_code"] == "409", mm
    assert mm["requests_on_mismatched"] == 0 and mm["its_identity"] != mm["cluster_identity"], mm
    assert res["verdict"] == "PASS" and r.returncode == 0, r.stdout[-3000:]
