"""Shared fixtures for end-to-end tests against the real `mererun` binary.

- `mererun_bin`: path of the binary (env MERERUN_BIN, else <repo>/build/bin/mererun).
- `run_mererun(*args, env=None, timeout=...)`: runs it, returns subprocess.CompletedProcess.
- `catalog`: the parsed models/catalog.json.
- `model_path(name)`: cached GGUF path of a catalog model; skips the test when not pulled
  (scripts/test.sh pulls every catalog model first).
- `coder_server`: `mererun serve` on qwen2.5-coder-0.5b-instruct (fill-in-the-middle markers),
  2,048-token context, one per test module.
- `cli_tokenize(text, *flags)`: `mererun tokenize` of that model (ids from outside the server).
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CATALOG_PATH = REPO_ROOT / "models" / "catalog.json"


def _bin_path() -> Path:
    env = os.environ.get("MERERUN_BIN")
    return Path(env) if env else REPO_ROOT / "build" / "bin" / "mererun"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def mererun_bin() -> Path:
    path = _bin_path()
    if not path.is_file():
        pytest.fail(f"mererun binary not found at {path}; build it (cmake --preset release && "
                    f"cmake --build --preset release) or set MERERUN_BIN")
    return path


@pytest.fixture(scope="session")
def run_mererun(mererun_bin):
    def run(*args, env=None, timeout=600, input=None):
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        return subprocess.run([str(mererun_bin), *map(str, args)], env=full_env, input=input,
                              capture_output=True, text=True, timeout=timeout)
    return run


@pytest.fixture(scope="session")
def catalog() -> dict:
    return json.loads(CATALOG_PATH.read_text())


def model_cache_dir() -> Path:
    home = os.environ.get("MERERUN_HOME")
    if home:
        return Path(home) / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "mererun" / "models"


@pytest.fixture(scope="session")
def model_path(catalog):
    def find(name: str) -> Path:
        for m in catalog["models"]:
            if name == m["name"] or name in m.get("aliases", []):
                path = model_cache_dir() / m["file"]
                if not path.is_file() or path.stat().st_size != m["size_bytes"]:
                    pytest.skip(f"model {name} is not pulled; run: build/bin/mererun pull {name}")
                return path
        raise KeyError(f"{name} is not in {CATALOG_PATH}")
    return find


CODER_MODEL = "qwen2.5-coder-0.5b-instruct"
SMOL_MODEL = "smollm2-135m-instruct"


def _server(mererun_bin, model_path, name):
    """A server of catalog model `name` with a 2,048-token context, stopped after the module."""
    from mererun_server import ServerProcess
    model_path(name)
    s = ServerProcess(mererun_bin, name, "-c", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def coder_server(mererun_bin, model_path):
    yield from _server(mererun_bin, model_path, CODER_MODEL)


@pytest.fixture(scope="module")
def smol_server(mererun_bin, model_path):
    yield from _server(mererun_bin, model_path, SMOL_MODEL)


@pytest.fixture(scope="module")
def coder_openai(coder_server):
    """The official OpenAI client on coder_server."""
    import openai
    return openai.OpenAI(base_url=coder_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def cli_tokenize(mererun_bin):
    def tokenize(text, *flags):
        out = subprocess.run([str(mererun_bin), "tokenize", "-m", CODER_MODEL, *flags], input=text,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    return tokenize
