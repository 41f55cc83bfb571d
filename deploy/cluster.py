#!/usr/bin/env python3
"""N `mererun serve` replicas behind HAProxy on loopback, with prefix affinity.

    python3 deploy/cluster.py start  --replicas 3 --model smollm2-135m-instruct --port 8080
    python3 deploy/cluster.py status
    python3 deploy/cluster.py rolling-restart
    python3 deploy/cluster.py kill --replica 2          # SIGKILL one replica (a crash)
    python3 deploy/cluster.py revive --replica 2        # start it again, same command
    python3 deploy/cluster.py stop

Clients use http://127.0.0.1:PORT exactly as they would use one server. HAProxy hashes each
request on its affinity key (deploy/haproxy/affinity.lua: Claude Code's session header, else the
leading part of the prompt) over a consistent-hash ring, checks each replica's
/health?identity=HASH (a replica that is loading, draining or another model/configuration is
out), and retries on another replica only when a connection could not be made (the request never
reached a server). Everything else, 429/529 with retry-after included, passes through unchanged.

State (pids, ports, the generated haproxy.cfg, logs, each replica's own KV disk cache) lives in
--state-dir (default $MERERUN_HOME/deploy or ~/.cache/mererun/deploy). docs/deploy.md explains
the topology; deploy/measure.py measures it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LUA = REPO / "deploy" / "haproxy" / "affinity.lua"


TEMPLATE = REPO / "deploy" / "haproxy" / "haproxy.cfg.in"


def render_haproxy_cfg(**values: str) -> str:
    """deploy/haproxy/haproxy.cfg.in with every @NAME@ replaced (all must be given)."""
    text = TEMPLATE.read_text()
    for k, v in values.items():
        text = text.replace(f"@{k}@", v)
    left = sorted(set(re.findall(r"@([A-Z_]+)@", text)))
    if left:
        raise ValueError(f"haproxy.cfg.in placeholders not filled: {left}")
    return text


class DeployError(Exception):
    """A configuration or start-up problem, reported as one clear line."""


def default_state_dir() -> Path:
    home = os.environ.get("MERERUN_HOME")
    if home:
        return Path(home) / "deploy"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mererun" / "deploy"


# --- small helpers -------------------------------------------------------------------------


def check_port(port: int, what: str) -> None:
    if not 1 <= port <= 65535:
        raise DeployError(f"{what} {port} is not a TCP port (1..65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise DeployError(f"{what} {port} is not free on 127.0.0.1 ({e.strerror}); choose another with --port") from None


def health(target: int | str, identity: str = "", timeout: float = 5.0) -> tuple[int, dict]:
    """GET /health of a loopback port or a base URL: (status, body), error statuses included."""
    base = target.rstrip("/") if isinstance(target, str) else f"http://127.0.0.1:{target}"
    url = base + "/health" + (f"?identity={identity}" if identity else "")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {}


def admin(sock_path: str, command: str) -> str:
    """One command on HAProxy's runtime API (the stats socket, level admin)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(sock_path)
        s.sendall(command.encode() + b"\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode(errors="replace")


def server_states(sock_path: str, backend: str = "replicas") -> dict[str, dict]:
    """HAProxy's view of each replica: {name: {status, check_status, check_code, scur}}."""
    text = admin(sock_path, "show stat")
    lines = [ln for ln in text.splitlines() if ln]
    header = lines[0].lstrip("# ").split(",")
    out = {}
    for ln in lines[1:]:
        row = dict(zip(header, ln.split(",")))
        if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND"):
            out[row["svname"]] = {k: row.get(k, "") for k in ("status", "check_status", "check_code", "scur", "stot")}
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of this process is not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return True
        except ChildProcessError:
            pass
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


# --- the cluster ---------------------------------------------------------------------------


class Cluster:
    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)
        self.state_file = self.dir / "state.json"
        self.state: dict = {}
        if self.state_file.exists():
            self.state = json.loads(self.state_file.read_text())

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.state_file)

    @property
    def socket(self) -> str:
        return str(self.dir / "haproxy.sock")

    def replica(self, i: int) -> dict:
        reps = self.state.get("replicas", [])
        if not 1 <= i <= len(reps):
            raise DeployError(f"no replica {i}: this cluster has {len(reps)} (1..{len(reps)})")
        return reps[i - 1]

    # -- replicas --

    def spawn_replica(self, rep: dict) -> None:
        log = open(self.dir / f"replica-{rep['index']}.log", "ab")
        proc = subprocess.Popen(rep["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **rep.get("env", {})})
        rep["pid"] = proc.pid

    def wait_replica_ready(self, rep: dict, timeout: float) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not pid_alive(rep["pid"]):
                log = Path(rep.get("log") or self.dir / f"replica-{rep['index']}.log")
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
                raise DeployError(f"replica {rep['index']} (port {rep['port']}) exited during start-up:\n{tail}")
            try:
                code, body = health(rep["port"], timeout=2)
                if code == 200:
                    return body
            except OSError:
                pass
            time.sleep(0.1)
        raise DeployError(f"replica {rep['index']} (port {rep['port']}) was not ready after {timeout:.0f} s")

    def stop_replica(self, rep: dict, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        pid = rep.get("pid")
        if not pid or not pid_alive(pid):
            return
        os.kill(pid, sig)
        if not wait_exit(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            wait_exit(pid, 5)

    # -- HAProxy --

    def write_haproxy_cfg(self) -> Path:
        st = self.state
        servers = "\n".join(f"    server r{r['index']} 127.0.0.1:{r['port']}" for r in st["replicas"])
        extra = ""
        if st.get("compare_port"):
            tracked = "\n".join(f"    server r{r['index']} 127.0.0.1:{r['port']} track replicas/r{r['index']}"
                                for r in st["replicas"])
            extra = f"""
# Round-robin over the same replicas, for comparison only (deploy/measure.py): what a plain load
# balancer does with the same traffic.
frontend mererun_roundrobin
    bind 127.0.0.1:{st['compare_port']}
    default_backend replicas_roundrobin

backend replicas_roundrobin
    balance roundrobin
    http-response set-header x-mererun-replica %s
{tracked}
"""
        path = self.dir / "haproxy.cfg"
        path.write_text(render_haproxy_cfg(LUA=str(LUA), ADMIN_SOCKET=self.socket, RESOLVERS="",
                                           BIND=f"127.0.0.1:{st['port']}", IDENTITY=st["identity"],
                                           SERVER_OPTIONS="", SERVERS=servers, EXTRA=extra))
        return path

    def start_haproxy(self) -> None:
        cfg = self.write_haproxy_cfg()
        check = subprocess.run([self.state["haproxy"], "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
        if check.returncode != 0:
            raise DeployError(f"haproxy rejected {cfg}:\n{check.stdout}{check.stderr}")
        log = open(self.dir / "haproxy.log", "ab")
        proc = subprocess.Popen([self.state["haproxy"], "-db", "-f", str(cfg)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.state["haproxy_pid"] = proc.pid
        deadline = time.time() + 30
        while time.time() < deadline:
            if not pid_alive(proc.pid):
                raise DeployError("haproxy exited at start:\n" + (self.dir / "haproxy.log").read_text()[-1500:])
            try:
                states = server_states(self.socket)
                if states and all(s["status"] == "UP" for s in states.values()):
                    return
            except (OSError, IndexError):
                pass
            time.sleep(0.1)
        raise DeployError("haproxy did not report every replica UP within 30 s: " + json.dumps(self.status()))

    def set_server(self, i: int, state: str) -> None:
        out = admin(self.socket, f"set server replicas/r{i} state {state}").strip()
        if out:
            raise DeployError(f"haproxy refused 'set server replicas/r{i} state {state}': {out}")

    def wait_server(self, i: int, want: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if server_states(self.socket).get(f"r{i}", {}).get("status") == want:
                return
            time.sleep(0.1)
        raise DeployError(f"replica {i} did not become {want} in haproxy within {timeout:.0f} s")

    # -- commands --

    def start(self, a: argparse.Namespace) -> None:
        if self.state.get("replicas") and any(pid_alive(r.get("pid", 0)) for r in self.state["replicas"]):
            raise DeployError(f"a cluster is already running from {self.dir} (cluster.py stop first)")
        if not 1 <= a.replicas <= 32:
            raise DeployError(f"--replicas {a.replicas}: between 1 and 32")
        mererun = Path(a.mererun)
        if not (mererun.is_file() and os.access(mererun, os.X_OK)):
            raise DeployError(f"--mererun {mererun}: no executable there (build it: bash scripts/setup.sh)")
        haproxy = shutil.which(a.haproxy) or (a.haproxy if os.access(a.haproxy, os.X_OK) else None)
        if not haproxy:
            raise DeployError(f"--haproxy {a.haproxy}: not found (Debian: apt-get install haproxy)")
        first = a.first_replica_port or a.port + 1
        ports = [first + i for i in range(a.replicas)]
        check_port(a.port, "--port")
        for p in ports:
            if p == a.port or (a.compare_port and p == a.compare_port):
                raise DeployError(f"replica port {p} collides with the load balancer's; set --first-replica-port")
            check_port(p, "replica port")
        if a.compare_port:
            check_port(a.compare_port, "--compare-port")
        threads = a.threads or max(1, (os.cpu_count() or 1) // a.replicas)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = {"port": a.port, "compare_port": a.compare_port, "haproxy": haproxy, "replicas": [],
                      "model": a.model, "started": time.time()}
        for i, p in enumerate(ports, 1):
            argv = [str(mererun.resolve()), "serve", "-m", a.model, "--host", "127.0.0.1", "--port", str(p), "-t",
                    str(threads), "--cache-dir", str(self.dir / f"replica-{i}" / "kv-cache")] + a.serve_args
            self.state["replicas"].append({"index": i, "port": p, "argv": argv})
        self.save()
        try:
            for rep in self.state["replicas"]:
                self.spawn_replica(rep)
            self.save()
            idents = {}
            for rep in self.state["replicas"]:
                body = self.wait_replica_ready(rep, a.ready_timeout)
                rep["identity"] = idents[rep["index"]] = body.get("identity_hash", "")
            if len(set(idents.values())) != 1:
                detail = ", ".join(f"replica {i}: {h}" for i, h in idents.items())
                raise DeployError(f"the replicas differ in model or configuration ({detail})")
            self.state["identity"] = idents[1]
            self.start_haproxy()
            self.save()
        except BaseException:
            self.stop()
            raise
        print(f"[cluster] {a.replicas} replicas of {a.model} (identity {self.state['identity']}) behind "
              f"haproxy on http://127.0.0.1:{a.port}" +
              (f"; round-robin comparison on :{a.compare_port}" if a.compare_port else ""))

    def stop(self) -> None:
        for rep in self.state.get("replicas", []):
            self.stop_replica(rep, signal.SIGTERM, timeout=40)
        pid = self.state.get("haproxy_pid")
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            wait_exit(pid, 10)
        if self.state:
            self.state["stopped"] = time.time()
            self.save()

    def status(self) -> dict:
        out = {"port": self.state.get("port"), "identity": self.state.get("identity"), "replicas": []}
        try:
            lb = server_states(self.socket)
        except OSError:
            lb = {}
        for rep in self.state.get("replicas", []):
            out["replicas"].append({"index": rep["index"], "port": rep["port"], "pid": rep.get("pid"),
                                    "alive": pid_alive(rep.get("pid", 0)) if rep.get("pid") else False,
                                    "haproxy": lb.get(f"r{rep['index']}", {})})
        return out

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        rep = self.replica(i)
        if rep.get("pid") and pid_alive(rep["pid"]):
            os.kill(rep["pid"], sig)
            if sig == signal.SIGKILL:
                wait_exit(rep["pid"], 10)

    def revive(self, i: int, ready_timeout: float = 300) -> None:
        rep = self.replica(i)
        if rep.get("pid") and pid_alive(rep["pid"]):
            raise DeployError(f"replica {i} is running (pid {rep['pid']})")
        self.respawn_checked(rep, ready_timeout)
        self.wait_server(i, "UP")

    def respawn_checked(self, rep: dict, ready_timeout: float) -> None:
        """Starts a stopped replica with its own command and waits until it is ready with the
        cluster's identity (a replica that comes back as another is an error, left out)."""
        self.spawn_replica(rep)
        self.save()
        body = self.wait_replica_ready(rep, ready_timeout)
        if body.get("identity_hash") != self.state["identity"]:
            raise DeployError(f"replica {rep['index']} came back as identity {body.get('identity_hash')}, "
                              f"the cluster serves {self.state['identity']}; left out of the ring")

    def rolling_restart(self, ready_timeout: float = 300, log=print) -> None:
        """One replica at a time: out of the hash ring (drain: no new requests), wait for its
        requests to finish, SIGTERM (it drains anything left), start it again, wait until ready
        and UP, put it back. Requests that had not started go to the other replicas."""
        for rep in self.state["replicas"]:
            i = rep["index"]
            self.set_server(i, "drain")
            deadline = time.time() + 600
            while time.time() < deadline:
                _, body = health(rep["port"])
                lb = server_states(self.socket).get(f"r{i}", {})
                if body.get("active", 1) == 0 and body.get("queued", 1) == 0 and lb.get("scur") == "0":
                    break
                time.sleep(0.1)
            self.stop_replica(rep, signal.SIGTERM, timeout=120)
            self.respawn_checked(rep, ready_timeout)
            self.set_server(i, "ready")
            self.wait_server(i, "UP")
            log(f"[cluster] replica {i} restarted (pid {rep['pid']})")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", default=str(default_state_dir()))
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start N replicas and haproxy")
    s.add_argument("--replicas", type=int, default=3)
    s.add_argument("--model", "-m", default="smollm2-135m-instruct")
    s.add_argument("--port", type=int, default=8080, help="the load balancer's port (clients use this)")
    s.add_argument("--first-replica-port", type=int, default=0, help="replicas listen on this and the next ports "
                   "(default: --port + 1)")
    s.add_argument("--compare-port", type=int, default=0, help="also a round-robin frontend here, for comparison")
    s.add_argument("--threads", type=int, default=0, help="threads per replica (default: cores / replicas)")
    s.add_argument("--mererun", default=str(REPO / "build" / "bin" / "mererun"))
    s.add_argument("--haproxy", default="haproxy")
    s.add_argument("--ready-timeout", type=float, default=300)
    s.add_argument("serve_args", nargs="*", help="after --: more `mererun serve` arguments for every replica")
    sub.add_parser("stop")
    sub.add_parser("status")
    r = sub.add_parser("rolling-restart")
    r.add_argument("--ready-timeout", type=float, default=300)
    for name in ("kill", "revive"):
        k = sub.add_parser(name)
        k.add_argument("--replica", type=int, required=True)
    a = p.parse_args(argv)
    c = Cluster(Path(a.state_dir))
    try:
        if a.cmd != "start" and not c.state:
            raise DeployError(f"no cluster state in {c.dir} (cluster.py start first)")
        if a.cmd == "start":
            c.start(a)
        elif a.cmd == "stop":
            c.stop()
        elif a.cmd == "status":
            print(json.dumps(c.status(), indent=1))
        elif a.cmd == "rolling-restart":
            c.rolling_restart(a.ready_timeout)
        elif a.cmd == "kill":
            c.kill(a.replica)
        elif a.cmd == "revive":
            c.revive(a.replica)
    except DeployError as e:
        print(f"cluster.py {a.cmd}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
