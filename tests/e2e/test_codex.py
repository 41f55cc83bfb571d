"""Codex CLI smoke test: the pinned CLI (tools/codex, @openai/codex 0.171.0) runs `codex exec`
against `mererun serve` on qwen2.5-coder-0.5b-instruct through the Responses API (a custom
provider with wire_api = "responses", as Codex's docs configure local servers).

Codex sends its whole default request (~8.6k tokens: its instructions, ~10 function tools, a
namespace of sub-agent tools and a hosted web_search tool, `store: false`, reasoning with
encrypted content asked for) and streams the answer. The task names the command, so the model's
function call is what Codex executes: the test asserts that the call came back as a
function_call item Codex could run (`cat secret.txt` succeeded with the file's text), that its
output went back in a follow-up request (prefix cache reused), and that Codex exits 0. Whether
the small model then repeats the code word is its own skill, not asserted here (with the 1.5B
model it answers "The code word is PELICAN-42": docs/api.md).
--temp 0 makes the model deterministic; --max-output-tokens bounds a rambling answer."""
import json
import os
import re
import subprocess

import pytest

from mererun_server import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-0.5b-instruct"


def test_codex_exec_runs_the_models_command(mererun_bin, model_path, repo_root, tmp_path):
    model_path(MODEL)
    codex = repo_root / "tools" / "codex" / "node_modules" / ".bin" / "codex"
    if not codex.exists():
        pytest.fail(f"{codex} is missing; run scripts/setup.sh (npm ci in tools/codex)")
    work = tmp_path / "work"
    work.mkdir()
    (work / "secret.txt").write_text("the code word is PELICAN-42\n")
    home = tmp_path / "codex-home"
    home.mkdir()
    server = ServerProcess(mererun_bin, MODEL, "-c", "16384", "--temp", "0", "--max-output-tokens", "300")
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "mererun"\n\n[model_providers.mererun]\nname = "mererun"\n'
        f'base_url = "{server.base_url}/v1"\nwire_api = "responses"\nstream_idle_timeout_ms = 1800000\n')
    try:
        env = dict(os.environ, CODEX_HOME=str(home), HOME=str(tmp_path))
        for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_API_KEY"):
            env.pop(key, None)
        proc = subprocess.run(
            [str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json",
             'Call exec_command with exactly {"cmd": "cat secret.txt"} and then tell me the code word.'],
            cwd=work, env=env, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        log = server.log()
    finally:
        server.stop()
    detail = f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-2000:]}\nserver: {log[-3000:]}"
    assert proc.returncode == 0, f"codex exited {proc.returncode}\n{detail}"
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert any(e["type"] == "turn.completed" for e in events), detail
    assert not any(e["type"] in ("turn.failed", "error") for e in events), detail
    runs = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"]
    assert runs and "cat secret.txt" in runs[0]["command"], detail
    assert runs[0]["exit_code"] == 0 and "PELICAN-42" in runs[0]["aggregated_output"], detail
    # The first request and at least one with the command's output, which reused the first's KV.
    done = re.findall(r"request done: (\d+) prompt tokens \((\d+) reused\)", log)
    assert len(done) >= 2 and int(done[1][1]) >= int(done[0][0]) - 16, log[-3000:]
