"""Logit parity with llama.cpp on the smallest model (docs/parity.md).

test_parity_smollm2 runs scripts/parity.py end to end: llama.cpp through node-llama-cpp
(tools/llamacpp, installed by the project's setup) and `mererun logits` on the same tokens, over
every prompt of tests/fixtures/parity/prompts.jsonl, and asserts the issue's bars
(top-1 agreement >= 0.98, mean KL(llama.cpp || mererun) <= 0.01). Missing pieces fail with a
clear message; set MERERUN_SKIP_LLAMACPP=1 to skip it where node-llama-cpp cannot run. It takes a
few minutes on 2 cores (most of it in node-llama-cpp), hence the `slow` mark.

The other tests check the comparison arithmetic on synthetic files (no model, no node).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "tests" / "fixtures" / "parity" / "prompts.jsonl"
SMALLEST = "smollm2-135m-instruct"


def _load_parity():
    spec = importlib.util.spec_from_file_location("parity", REPO / "scripts" / "parity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["parity"] = mod
    spec.loader.exec_module(mod)
    return mod


parity = _load_parity()


# ---------------------------------------------------------------------------------------------
# Synthetic files.

def _log_softmax(row):
    m = max(row)
    z = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - z for x in row]


def _write_pair(tmp: Path, ref_rows, ours_rows, n_positions, k):
    """ref.bin from ref_rows (full logits, reduced to top-k + tail) and ours.mrlg from ours_rows."""
    n_vocab = len(ref_rows[0])
    with open(tmp / "ref.bin", "wb") as f:
        f.write(b"LCRF" + struct.pack("<3I", 1, n_vocab, len(n_positions)))
        f.write(struct.pack(f"<{len(n_positions)}I", *n_positions))
        for row in ref_rows:
            lp = _log_softmax(row)
            order = sorted(range(n_vocab), key=lambda i: -lp[i])[:k]
            tail = sum(math.exp(lp[i]) for i in range(n_vocab) if i not in set(order))
            f.write(struct.pack("<Id", len(order), tail))
            f.write(struct.pack(f"<{len(order)}i", *order))
            f.write(struct.pack(f"<{len(order)}f", *[lp[i] for i in order]))
    with open(tmp / "ours.mrlg", "wb") as f:
        f.write(b"MRLG" + struct.pack("<3I", 1, n_vocab, len(n_positions)))
        f.write(struct.pack(f"<{len(n_positions)}I", *n_positions))
        for row in ours_rows:
            f.write(struct.pack(f"<{n_vocab}f", *row))


def _kl(p_logits, q_logits, buckets=None):
    lp, lq = _log_softmax(p_logits), _log_softmax(q_logits)
    if buckets is None:
        return sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))
    head, rest = buckets
    kl = sum(math.exp(lp[i]) * (lp[i] - lq[i]) for i in head)
    pr = sum(math.exp(lp[i]) for i in rest)
    qr = sum(math.exp(lq[i]) for i in rest)
    return kl + (pr * math.log(pr / qr) if pr > 0 else 0.0)


def test_identical_logits_give_zero_kl(tmp_path):
    rng = random.Random(1)
    rows = [[rng.gauss(0, 3) for _ in range(300)] for _ in range(7)]
    _write_pair(tmp_path, rows, rows, [3, 4], k=300)
    r = parity.compare_files("synthetic", tmp_path / "ref.bin", tmp_path / "ours.mrlg", ["a", "b"])
    assert r["n_positions"] == 7 and r["n_prompts"] == 2
    assert r["top1_agreement"] == 1.0
    assert r["mean_kl"] < 1e-6
    assert r["verdict"] == "PASS"


def test_kl_matches_direct_computation(tmp_path):
    rng = random.Random(2)
    ref = [[rng.gauss(0, 2) for _ in range(200)] for _ in range(5)]
    ours = [[x + rng.gauss(0, 0.3) for x in row] for row in ref]
    # Full support: the exact KL.
    _write_pair(tmp_path, ref, ours, [5], k=200)
    r = parity.compare_files("s", tmp_path / "ref.bin", tmp_path / "ours.mrlg", ["a"])
    want = sum(_kl(p, q) for p, q in zip(ref, ours)) / len(ref)
    assert r["mean_kl"] == pytest.approx(want, rel=1e-4)
    # Top-20 plus a tail bucket: the KL of the coarsened distributions, below the exact one.
    _write_pair(tmp_path, ref, ours, [5], k=20)
    r2 = parity.compare_files("s", tmp_path / "ref.bin", tmp_path / "ours.mrlg", ["a"])
    coarse = []
    for p, q in zip(ref, ours):
        lp = _log_softmax(p)
        head = sorted(range(200), key=lambda i: -lp[i])[:20]
        coarse.append(_kl(p, q, (head, [i for i in range(200) if i not in head])))
    assert r2["mean_kl"] == pytest.approx(sum(coarse) / len(coarse), rel=1e-4)
    assert r2["mean_kl"] <= r["mean_kl"] + 1e-9
    assert r2["ref_tail_mass_mean"] > 0


def test_peaked_rows_keep_a_finite_tail_term(tmp_path):
    """A row whose top tokens hold all but ~1e-16 of the mass: 1 - (ours' head mass) rounds to 0
    in double, which made the tail term ln(r / 0) = inf (a sd-6 generated model hit it). The tail
    is then summed directly, and the KL is the coarsened one computed here independently."""
    rng = random.Random(4)
    ref = [[0.0, -1.0, -2.0] + [-40.0 + rng.gauss(0, 1) for _ in range(197)] for _ in range(3)]
    ours = [[x + rng.gauss(0, 0.05) for x in row] for row in ref]
    _write_pair(tmp_path, ref, ours, [3], k=3)
    r = parity.compare_files("s", tmp_path / "ref.bin", tmp_path / "ours.mrlg", ["a"])
    assert r["ref_tail_mass_mean"] > 0
    assert math.isfinite(r["mean_kl"]) and r["n_nonfinite"] == 0
    want = sum(_kl(p, q, ([0, 1, 2], list(range(3, 200)))) for p, q in zip(ref, ours)) / 3
    assert r["mean_kl"] == pytest.approx(want, rel=1e-3)
    assert r["verdict"] == "PASS"


def test_disagreement_and_bad_values_fail(tmp_path):
    rng = random.Random(3)
    ref = [[rng.gauss(0, 1) for _ in range(50)] for _ in range(4)]
    ours = [list(reversed(row)) for row in ref]  # different argmax almost surely
    ours[1][7] = float("nan")
    _write_pair(tmp_path, ref, ours, [4], k=50)
    r = parity.compare_files("s", tmp_path / "ref.bin", tmp_path / "ours.mrlg", ["a"])
    assert r["n_nonfinite"] == 1
    assert r["top1_agreement"] < 1.0
    assert r["verdict"] == "FAIL"


def _write_mrlg(path: Path, rows, n_positions):
    with open(path, "wb") as f:
        f.write(b"MRLG" + struct.pack("<3I", 1, len(rows[0]), len(n_positions)))
        f.write(struct.pack(f"<{len(n_positions)}I", *n_positions))
        for row in rows:
            f.write(struct.pack(f"<{len(row)}f", *row))


def test_vs_exact_measures_both_sides_with_one_metric(tmp_path):
    """--vs-exact: llama.cpp (top-K records) and mererun's fast path (full rows, reduced to the same
    K) each against the exact rows. The side that matches the exact rows gets KL 0 and is the more
    faithful one, whichever it is; the KL of the other is the coarsened KL computed directly."""
    rng = random.Random(4)
    exact = [[rng.gauss(0, 2) for _ in range(120)] for _ in range(6)]
    noisy = [[x + rng.gauss(0, 0.4) for x in row] for row in exact]
    _write_mrlg(tmp_path / "exact.mrlg", exact, [2, 4])
    k = 16
    # llama.cpp noisy, mererun exact: mererun is as faithful.
    _write_pair(tmp_path, noisy, exact, [2, 4], k=k)
    v = parity.compare_vs_exact("s", tmp_path / "ref.bin", tmp_path / "ours.mrlg", tmp_path / "exact.mrlg", 0)
    assert v["mererun"]["mean_kl"] < 1e-6 and v["mererun"]["top1_agreement"] == 1.0
    want = []
    for p, q in zip(noisy, exact):
        lp = _log_softmax(p)
        head = sorted(range(120), key=lambda i: -lp[i])[:k]
        want.append(_kl(p, q, (head, [i for i in range(120) if i not in head])))
    assert v["llamacpp"]["mean_kl"] == pytest.approx(sum(want) / len(want), rel=1e-3)
    assert v["llamacpp"]["mean_kl"] > 1e-3
    assert v["as_faithful"] is True
    # The other way round: mererun noisy (reduced to llama.cpp's K), llama.cpp exact.
    _write_pair(tmp_path, exact, noisy, [2, 4], k=k)
    v = parity.compare_vs_exact("s", tmp_path / "ref.bin", tmp_path / "ours.mrlg", tmp_path / "exact.mrlg", 0)
    assert v["llamacpp"]["mean_kl"] < 1e-6
    assert v["mererun"]["mean_kl"] == pytest.approx(sum(want) / len(want), rel=1e-3)
    assert v["as_faithful"] is False


def test_count_mismatch_is_reported(tmp_path):
    rows = [[0.0, 1.0, 2.0]] * 3
    _write_pair(tmp_path, rows, rows, [3], k=3)
    with open(tmp_path / "ours.mrlg", "r+b") as f:  # claim 2 positions instead of 3
        f.seek(16)
        f.write(struct.pack("<I", 2))
    with pytest.raises(parity.ParityError, match="counts differ"):
        parity.compare_files("s", tmp_path / "ref.bin", tmp_path / "ours.mrlg", ["a"])


def test_prompts_fixture_is_varied_and_large_enough():
    prompts = [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    assert len(prompts) >= 32
    assert len({p["id"] for p in prompts}) == len(prompts)
    kinds = {p["kind"] for p in prompts}
    assert {"prose", "chat", "code", "numbers", "multilingual"} <= kinds


# ---------------------------------------------------------------------------------------------
# The real check.

def _prerequisites():
    if os.environ.get("MERERUN_SKIP_LLAMACPP") == "1":
        pytest.skip("MERERUN_SKIP_LLAMACPP=1")
    try:
        _, model_path = parity.resolve_model(SMALLEST)
    except parity.ParityError as e:
        pytest.fail(f"parity prerequisites missing: {e} (set MERERUN_SKIP_LLAMACPP=1 to skip)")
    if shutil.which(os.environ.get("NODE", "node")) is None or not (
            REPO / "tools" / "llamacpp" / "node_modules" / "node-llama-cpp").exists():
        pytest.fail("node-llama-cpp is not installed: run `npm ci` in tools/llamacpp "
                    "(or set MERERUN_SKIP_LLAMACPP=1 to skip)")
    return model_path


def _run_parity(model_path, mererun, work, extra=()):
    report = work / "parity.json"
    rc = parity.main(["--model", str(model_path), "--mererun", str(mererun),
                      "--work-dir", str(work), "--json-out", str(report), *extra])
    results = json.loads(report.read_text())["results"] if report.is_file() else []
    assert results, f"parity.py failed (exit {rc}); its [parity] messages are in the captured stderr"
    (r,) = results
    summary = (f"top1 {r['top1_agreement']:.4f}, mean KL {r['mean_kl']:.5f}, "
               f"max KL {r['max_kl']:.4f} at {r['max_kl_at']}, {r['n_positions']} positions")
    print(summary)
    assert r["n_prompts"] >= 32
    assert r["n_nonfinite"] == 0, summary
    return r, rc, summary


@pytest.mark.slow
def test_parity_exact_weights_meets_the_bars(tmp_path, mererun_bin):
    """The forward pass itself: SmolLM2 rewritten with F32 matrices (`mererun convert`), llama.cpp
    on that file (F32 matmuls) against mererun's reference path (FP32 activations on the GGUF
    weights). Both sides then compute the same function up to float rounding and llama.cpp's F16
    KV cache, so the issue's bars hold with a wide margin (measured: top-1 0.996, KL 7e-5)."""
    model_path = _prerequisites()
    f32 = tmp_path / "smollm2-f32.gguf"
    conv = subprocess.run([str(mererun_bin), "convert", "-m", str(model_path), "--type", "f32",
                           "-o", str(f32)], capture_output=True, text=True, timeout=600)
    assert conv.returncode == 0, conv.stderr
    r, rc, summary = _run_parity(f32, mererun_bin, tmp_path, ["--mererun-arg=--ref"])
    assert r["top1_agreement"] >= parity.TOP1_MIN, summary
    assert r["mean_kl"] <= parity.MEAN_KL_MAX, summary
    assert rc == 0


@pytest.mark.slow
def test_parity_fast_path_on_the_q4_1_file(tmp_path, mererun_bin, monkeypatch):
    """The shipped path, with its default activation precision, on the real Q4_1 GGUF, and the
    native-kernels issue's fidelity bar: against mererun's exact path (FP32 activations on the
    same weights, `--vs-exact`), the fast path is no further than llama.cpp (which reads Q4_1
    against Q8_1 activations) in mean KL and top-1. With every matrix on int8 activations it is
    not (measured on 32 prompts: top-1 0.9467 / KL 0.00899 against llama.cpp's 0.9620 / 0.00503);
    the default reads q, k, v, o and down as two int8 rows (0.9689 / 0.00308). Against llama.cpp
    itself, a broken kernel or layout gives top-1 < 0.5."""
    model_path = _prerequisites()
    monkeypatch.delenv("MERERUN_ACTS", raising=False)
    r, rc, summary = _run_parity(model_path, mererun_bin, tmp_path, ["--limit", "32", "--vs-exact"])
    assert r["top1_agreement"] >= 0.92, summary
    assert r["mean_kl"] <= 0.02, summary
    v = r["vs_exact"]
    assert v["as_faithful"], v


@pytest.mark.slow
def test_parity_fast_path_on_a_q8_0_file(tmp_path, mererun_bin):
    """Native Q8_0 tiles (issue 12): SmolLM2 rewritten with Q8_0 matrices (`mererun convert`), run
    by the fast path on the file's own Q8_0 words against llama.cpp on the same file. The load log
    must say every matrix is native (a fall-back to Q8/g64 would requantize them), and the logits
    must agree at least as well as on the Q4_1 file. A wrong offset, sign or block layout in the
    Q8_0 kernel gives top-1 below 0.5."""
    model_path = _prerequisites()
    q8 = tmp_path / "smollm2-q8_0.gguf"
    conv = subprocess.run([str(mererun_bin), "convert", "-m", str(model_path), "--type", "q8_0",
                           "-o", str(q8)], capture_output=True, text=True, timeout=600)
    assert conv.returncode == 0, conv.stderr
    run = subprocess.run([str(mererun_bin), "run", "-m", str(q8), "-p", "Hi", "-n", "1", "-t", "2"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "MERERUN_LOG": "info"})
    assert run.returncode == 0, run.stderr
    # 30 layers x 7 matrices + the tied embedding, all Q8_0 after the rewrite.
    assert "211 matrices native" in run.stderr, run.stderr[-2000:]
    r, _, summary = _run_parity(q8, mererun_bin, tmp_path / "parity")
    assert r["top1_agreement"] >= 0.92, summary
    assert r["mean_kl"] <= 0.02, summary


@pytest.mark.slow
@pytest.mark.parametrize("model,limit", [(SMALLEST, 8), ("gemma3-270m", 3)])
def test_native_reference_matches_the_node_reference(model, limit, tmp_path):
    """scripts/parity.py takes llama.cpp's distributions from tools/llamacpp/build/logits_ref
    (built by scripts/setup.sh against node-llama-cpp's own libllama) instead of logits_ref.mjs,
    which hands each position's whole distribution to JavaScript (~80 ms a position on a 150k
    vocabulary). It must be the same oracle: on the same prompts both write byte-identical
    tokens.json and ref.bin (the tokenization with and without a BOS, the sort, the float32
    softmax and the top-K reduction). SmolLM2 adds no BOS, Gemma 3 does (and has a 262k vocabulary)."""
    _prerequisites()
    native = parity.LOGITS_REF_NATIVE
    if not native.is_file():
        pytest.fail(f"{native} is not built: run tools/llamacpp/build_logits_ref.sh (scripts/setup.sh does)")
    _, model_path = parity.resolve_model(model)
    outs = {}
    for name, cmd in (("native", [str(native)]),
                      ("node", [os.environ.get("NODE", "node"), str(parity.LOGITS_REF)])):
        out = tmp_path / name
        r = subprocess.run([*cmd, str(model_path), str(PROMPTS), str(out), "--limit", str(limit), "--threads", "2"],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        outs[name] = out
    meta = {k: json.loads((outs[k] / "meta.json").read_text()) for k in outs}
    assert meta["native"]["n_positions"] == meta["node"]["n_positions"] > 10 * limit
    assert meta["native"]["add_bos"] == meta["node"]["add_bos"] == (model != SMALLEST)
    for f in ("tokens.json", "ref.bin"):
        assert (outs["native"] / f).read_bytes() == (outs["node"] / f).read_bytes(), f
