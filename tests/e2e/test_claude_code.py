"""Claude Code smoke test: the pinned CLI (tools/claude-code, @anthropic-ai/claude-code 2.1.328)
in print mode against `mererun serve` on qwen2.5-coder-1.5b-instruct completes a turn that uses
a tool (Read) and exits 0.

Claude Code's default prompt is ~11.6k tokens (12 tools); on this 2-core CPU its prefill takes
far longer than a CI budget allows (docs/api.md), so the test runs `--bare` with a short
`--system-prompt` and only the Read tool (~500 tokens). What the full request contains is
checked separately, on the captured body (test_server_tools.py::test_claude_code_request_is_accepted).
Environment: ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY (any value unless the server has --api-key),
DISABLE_TELEMETRY=1, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1, API_TIMEOUT_MS (long prefill),
a throwaway HOME. Claude Code asks for max_tokens 128000 and samples at the model's default
temperature; --temp 0 makes the model deterministic, --max-output-tokens 200 bounds a rambling
answer and --max-turns 4 a tool-call loop (Qwen2.5-Coder-0.5B, greedy, re-reads the file forever
under a system prompt that says "first call Read"; 1.5B with this one reads once and answers)."""
import json
import os
import re
import subprocess

import pytest

from mererun_server import ServerProcess

pytestmark = pytest.mark.slow


def test_claude_code_print_mode_reads_a_file(mererun_bin, model_path, repo_root, tmp_path):
    model_path("qwen2.5-coder-1.5b-instruct")
    claude = repo_root / "tools" / "claude-code" / "node_modules" / ".bin" / "claude"
    if not claude.exists():
        pytest.fail(f"{claude} is missing; run scripts/setup.sh (npm ci in tools/claude-code)")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("The secret word is pineapple.\n")
    home = tmp_path / "home"
    home.mkdir()
    server = ServerProcess(mererun_bin, "qwen2.5-coder-1.5b-instruct", "-c", "4096", "--api-key", "smoke-key",
                           "--max-output-tokens", "200", "--temp", "0")
    try:
        env = dict(os.environ, HOME=str(home), ANTHROPIC_BASE_URL=server.base_url, ANTHROPIC_API_KEY="smoke-key",
                   DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", API_TIMEOUT_MS="1800000")
        env.pop("ANTHROPIC_AUTH_TOKEN", None)
        proc = subprocess.run(
            [str(claude), "-p", "Read the file notes.txt and tell me the secret word.", "--bare",
             "--system-prompt", f"You are a coding assistant working in {work}. Use the Read tool to read files; once you have "
             "a file's content, answer the user's question in plain text.",
             "--tools", "Read", "--allowedTools", "Read", "--output-format", "json", "--max-turns", "4"],
            cwd=work, env=env, capture_output=True, text=True, timeout=1800)
        log = server.log()
    finally:
        server.stop()
    assert proc.returncode == 0, f"claude exited {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}\nserver: {log[-3000:]}"
    out = json.loads(proc.stdout)
    assert out["is_error"] is False and out["subtype"] == "success", out
    # A tool-using turn is two model calls: the Read call, then the answer from its result.
    assert out["num_turns"] >= 2, out
    assert len(re.findall(r"POST /v1/messages\?beta=true", log)) >= 2, log[-3000:]
    assert "pineapple" in out["result"].lower(), out["result"]
