"""A `mererun serve` process for end-to-end tests: started on a free port (--port 0), its
stderr kept in a log file (tests read it to see cancellations), stopped with SIGTERM."""
import json
import os
import re
import shutil
import urllib.error
import urllib.request
import subprocess
import tempfile
import time
from pathlib import Path


class ServerProcess:
    def __init__(self, binary: Path, model: str, *args, env=None, startup_timeout=120, wait_ready=True):
        self.log_path = Path(tempfile.mkstemp(prefix="mererun-serve-", suffix=".log")[1])
        full_env = dict(os.environ)
        full_env.setdefault("MERERUN_LOG", "info")
        if env:
            full_env.update(env)
        self._log = open(self.log_path, "wb")
        args = [str(a) for a in args]
        if "--drain-seconds" not in args:  # stop() sends SIGTERM: don't wait long for stragglers
            args += ["--drain-seconds", "5"]
        # The prefix cache's disk tier outlives a server: each server gets a directory of its own
        # (removed at stop) unless the test shares one on purpose.
        self._own_cache_dir = None
        if "--cache-dir" not in args:
            self._own_cache_dir = tempfile.mkdtemp(prefix="mererun-kv-")
            args += ["--cache-dir", self._own_cache_dir]
        self.proc = subprocess.Popen([str(binary), "serve", "-m", model, "--port", "0", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=full_env)
        deadline = time.time() + startup_timeout
        self.port = None
        while time.time() < deadline:
            m = re.search(r"listening on http://[^:]+:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"mererun serve exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"mererun serve did not start in {startup_timeout}s:\n{self.log()}")
        self.base_url = f"http://127.0.0.1:{self.port}"
        # The port opens before the warm-up generation ends; /health answers 529 "loading" until
        # then (requests would get 529). wait_ready=False leaves that to the test.
        if wait_ready:
            self.wait_ready(deadline - time.time())

    def health(self):
        with urllib.request.urlopen(self.base_url + "/health", timeout=10) as r:
            return r.status, json.loads(r.read())

    def wait_idle(self, timeout=30.0):
        """Waits until nothing is active or queued (a cancelled or finished generation has let its
        slot go); the last /health body. AssertionError after `timeout` seconds."""
        deadline = time.time() + timeout
        while True:
            h = self.health()[1]
            if h["active"] == 0 and h["queued"] == 0:
                return h
            assert time.time() < deadline, f"slots still busy after {timeout} s: {h}"
            time.sleep(0.1)

    def wait_ready(self, timeout=120.0):
        deadline = time.time() + timeout
        while True:
            try:
                if self.health()[0] == 200:
                    return
            except urllib.error.HTTPError as e:
                if e.code != 529:
                    raise
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"mererun serve exited with {self.proc.returncode}:\n{self.log()}")
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"mererun serve was not ready in time:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout=30.0) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.log()):
                return True
            time.sleep(0.1)
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._own_cache_dir:
            shutil.rmtree(self._own_cache_dir, ignore_errors=True)
        # Under the ASan+UBSan build (MERERUN_BIN=build-asan/bin/mererun) a finding is printed
        # to the log: fail the test that started this server.
        log = self.log()
        for marker in ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer"):
            if marker in log:
                i = log.index(marker)
                raise AssertionError(f"sanitizer finding in the server log:\n{log[max(0, i - 200):i + 3000]}")
