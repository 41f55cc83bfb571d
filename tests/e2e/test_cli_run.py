"""End-to-end: the real binary, a real model from the catalog (pulled by scripts/test.sh)."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("MERERUN_BIN", str(ROOT / "build" / "bin" / "mererun"))
SMOL = "smollm2-135m-instruct"


def run(*args, input_text=None, timeout=300):
    return subprocess.run([BIN, *args], input=input_text, capture_output=True, text=True, timeout=timeout)


def test_smollm2_answers_capital_of_france():
    # "Name the capital city of France." rather than "What is the capital of France?": on the latter
    # the exact arithmetic itself prefers "The" over "L'" by 0.11 logits, so any change of rounding
    # (activation precision, group size) may flip the greedy answer; the reference-path test below
    # keeps that question.
    r = run("run", "-m", SMOL, "-p", "Name the capital city of France.", "-n", "32")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, f"stdout: {r.stdout!r}\nstderr: {r.stderr}"
    assert "tok/s" in r.stderr  # the speed line


def test_reference_path_gives_the_same_greedy_answer():
    r = run("run", "-m", SMOL, "--ref", "-p", "What is the capital of France?", "-n", "16")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "reference path" in r.stderr


def test_tokenize_round_trip_through_cli():
    text = "Hello, world! naïve café — 東京 🙂\n\tdef f(x): return x**2"
    r = run("tokenize", "-m", SMOL, "--no-add-special", input_text=text)
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)
    assert ids and all(isinstance(i, int) for i in ids)
    d = run("tokenize", "-m", SMOL, "--decode", input_text=json.dumps(ids))
    assert d.returncode == 0, d.stderr
    assert d.stdout == text


def test_info_reports_architecture_and_template():
    r = run("info", "-m", SMOL)
    assert r.returncode == 0, r.stderr
    assert "architecture:  llama" in r.stdout
    assert "chat template: yes" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "-p", "hi"], "-m MODEL is required"),
        (["run", "-m", SMOL], "-p TEXT is required"),
        (["run", "-m", "/nonexistent/model.gguf", "-p", "hi"], "no such file"),
        (["run", "-m", SMOL, "-p", "hi", "--bogus"], "argument was not expected: --bogus"),
        (["tokenize", "-m", SMOL, "--decode"], "JSON array"),
        (["frobnicate"], "unknown command"),
    ],
)
def test_cli_errors_are_clear_and_nonzero(args, needle):
    r = run(*args, input_text="")
    assert r.returncode != 0
    assert needle in r.stderr, r.stderr


def test_malformed_gguf_is_an_error_not_a_crash(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    r = run("info", "-m", str(bad))
    assert r.returncode == 1
    assert "[gguf]" in r.stderr
    r = run("run", "-m", str(bad), "-p", "hi")
    assert r.returncode == 1
    assert "[gguf]" in r.stderr
