"""End-to-end: command-line parsing (CLI11, src/app/cli.h) of every command.

Usage errors are found before any model is loaded, so these tests need no pulled model: each runs
in well under a second. Exit status 2 is a usage error, 0 is --help.
"""
import pytest

# Every command and the options (with a default shown as "=VALUE") its --help must list.
HELP_CASES = [
    (["serve"], ["-m,--model", "--port", "=8080", "--host", "=127.0.0.1", "-c,--ctx", "--api-key",
                 "MERERUN_API_KEY", "--allow-host", "--allow-origin", "--max-active", "=8", "--max-queue",
                 "=16", "--drain-seconds", "=30", "--max-body-bytes", "=33554432", "--temp", "-t,--threads",
                 "--signing-key-file", "--no-warmup", "--prefix-cache-mb", "=1024"]),
    (["pull"], ["NAME", "--all", "--verify"]),
    (["list"], ["--json"]),
    (["run"], ["-m,--model", "-p,--prompt", "-n,--n-predict", "=64", "-c,--ctx", "--raw", "--ref"]),
    (["info"], ["-m,--model"]),
    (["tokenize"], ["-m,--model", "--decode", "--no-add-special", "--parse-special"]),
    (["logits"], ["-m,--model", "--tokens", "-o,--out"]),
    (["convert"], ["-m,--model", "--type", "=q8_0", "-o,--out"]),
    (["bench"], ["-m,--model", "--models", "-t,--threads", "--reps", "=3", "--quick", "--no-llamacpp",
                 "--machine-only", "--json"]),
    (["qualify", "likelihood"], ["--reference", "--candidate", "--windows", "=16", "--positions", "=2048",
                                 "--chunk", "=128", "--bar", "=1.001", "--resamples", "=2000", "--seed",
                                 "--data"]),
    (["qualify", "speed"], ["--reference", "=draft=0", "--candidate", "=draft=ngram,k=auto", "-w,--workloads",
                            "-n,--n", "=3", "--max-tokens", "--min-gain", "=5", "--greedy", "--keep-cache"]),
]


@pytest.mark.parametrize("cmd, options", HELP_CASES, ids=[" ".join(c) for c, _ in HELP_CASES])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help_with_options_and_defaults(run_mererun, cmd, options, flag):
    r = run_mererun(*cmd, flag)
    assert r.returncode == 0, r.stderr
    assert f"Usage: mererun {' '.join(cmd)}" in r.stdout
    missing = [o for o in options if o not in r.stdout]
    assert not missing, f"--help lacks {missing}:\n{r.stdout}"


def test_top_level_help_lists_every_command(run_mererun):
    r = run_mererun("--help")
    assert r.returncode == 0
    for cmd in ["serve", "pull", "list", "run", "info", "tokenize", "logits", "convert", "bench",
                "qualify likelihood", "qualify speed"]:
        assert cmd in r.stdout, cmd
    r = run_mererun()
    assert r.returncode == 2
    assert "usage: mererun COMMAND" in r.stderr


def test_qualify_help_lists_its_commands(run_mererun):
    r = run_mererun("qualify", "--help")
    assert r.returncode == 0
    assert "likelihood" in r.stdout and "speed" in r.stdout
    r = run_mererun("qualify")
    assert r.returncode == 2
    assert "likelihood" in r.stderr and "speed" in r.stderr


# (arguments, the option the message must name, the allowed range or values it must state)
BAD_VALUES = [
    (["serve", "-m", "x", "--port", "abc"], "--port", "0..65535"),
    (["serve", "-m", "x", "--port", "70000"], "--port", "0..65535"),
    (["serve", "-m", "x", "--port", "-1"], "--port", "0..65535"),
    (["serve", "-m", "x", "--max-active", "0"], "--max-active", ">= 1"),
    (["serve", "-m", "x", "--max-queue", "-1"], "--max-queue", ">= 0"),
    (["serve", "-m", "x", "--max-body-bytes", "100"], "--max-body-bytes", ">= 1024"),
    (["serve", "-m", "x", "--drain-seconds", "-1"], "--drain-seconds", "0..86400"),
    (["serve", "-m", "x", "--temp", "-0.5"], "--temp", "0..2"),
    (["serve", "-m", "x", "-c", "8k"], "--ctx", ">= 0"),
    (["serve", "-m", "x", "-t", "0"], "--threads", ">= 1"),
    (["run", "-m", "x", "-p", "hi", "-n", "-5"], "--n-predict", "0.."),
    (["run", "-m", "x", "-p", "hi", "-n", "12abc"], "--n-predict", "0.."),
    (["run", "-m", "x", "-p", "hi", "-t", "0"], "--threads", ">= 1"),
    (["run", "-m", "x", "-p", "hi", "--threads", "two"], "--threads", ">= 1"),
    (["convert", "-m", "x", "-o", "y", "--type", "q4"], "--type", "f32,f16,q8_0"),
    (["bench", "--reps", "0"], "--reps", "1..1000"),
    (["bench", "--threads", "0,x"], "--threads", "1..256"),
    (["qualify", "likelihood", "-m", "x", "--reference", "path=ref", "--candidate", "path=fast",
      "--windows", "0"], "--windows", ">= 1"),
    (["qualify", "likelihood", "-m", "x", "--reference", "path=ref", "--candidate", "path=fast",
      "--bar", "0"], "--bar", "> 0"),
    (["qualify", "likelihood", "-m", "x", "--reference", "path=ref", "--candidate", "path=fast",
      "--seed", "-1"], "--seed", ">= 0"),
    (["qualify", "speed", "-m", "x", "-n", "0"], "--n", ">= 1"),
    (["qualify", "speed", "-m", "x", "--min-gain", "abc"], "--min-gain", "-100..1000"),
    (["qualify", "speed", "-m", "x", "--max-tokens", "-3"], "--max-tokens", ">= 0"),
]


@pytest.mark.parametrize("args, option, allowed", BAD_VALUES, ids=[" ".join(a) for a, _, _ in BAD_VALUES])
def test_bad_value_is_a_usage_error_naming_option_and_range(run_mererun, args, option, allowed):
    r = run_mererun(*args)
    assert r.returncode == 2, r.stderr
    assert option in r.stderr, r.stderr
    assert allowed in r.stderr, r.stderr
    assert f"mererun {args[0]}" in r.stderr


@pytest.mark.parametrize("args, unknown", [
    (["run", "-m", "x", "-p", "hi", "--bogus"], "--bogus"),
    (["serve", "-m", "x", "--prot", "8080"], "--prot"),
    (["list", "--nope"], "--nope"),
    (["qualify", "speed", "-m", "x", "--frobnicate"], "--frobnicate"),
    (["info", "-m", "x", "stray"], "stray"),
])
def test_unknown_argument_is_a_usage_error(run_mererun, args, unknown):
    r = run_mererun(*args)
    assert r.returncode == 2, r.stderr
    assert "not expected" in r.stderr and unknown in r.stderr, r.stderr


def test_missing_value_is_a_usage_error(run_mererun):
    r = run_mererun("serve", "-m", "x", "--port")
    assert r.returncode == 2
    assert "--port" in r.stderr


def test_valid_spellings_are_accepted(run_mererun, tmp_path):
    # Every form below parses; the command then fails only on the missing model file (1, not 2).
    missing = str(tmp_path / "missing.gguf")
    r = run_mererun("serve", "-m", missing, "--port", "1", "--port=0", "--allow-host", "a.lan,b.lan",
                    "--allow-host=c.lan", "--allow-origin", "http://localhost:3000", "--temp", "0",
                    "--drain-seconds", "5", "--max-active", "1", "-t", "2", "--no-warmup",
                    "--signing-key-file", tmp_path / "key", env={"MERERUN_API_KEY": "k"})
    assert r.returncode == 1, r.stderr
    assert "no such file" in r.stderr
    r = run_mererun("run", "--model", missing, "--prompt=hi", "-n", "0", "--threads=3", "--ref", "--raw")
    assert r.returncode == 1, r.stderr
    assert "no such file" in r.stderr
