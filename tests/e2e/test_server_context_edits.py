"""Context editing (context_management.edits) and reasoning replay through the official
Anthropic SDK (beta surface) on SmolLM2: clear_tool_uses_20250919 (trigger, keep,
clear_at_least, exclude_tools, clear_tool_inputs) and clear_thinking_20251015 (keep), with the
response's applied_edits, count_tokens' original_input_tokens, and the prompt sizes both report;
verified thinking of the current tool loop is replayed into the prompt, earlier turns' is not."""
import anthropic
import pytest

from mererun_server import ServerProcess

READ = {"name": "read_file", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
LS = {"name": "list_dir", "description": "List a directory.",
      "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path("smollm2-135m-instruct")
    s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "4096")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def tool_history(n_uses=5, tool_names=None):
    """A user question, then n tool uses (each answered by a long result), ending on a result."""
    msgs = [{"role": "user", "content": "Summarize the project files."}]
    for i in range(n_uses):
        name = (tool_names or ["read_file"] * n_uses)[i]
        msgs.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{i:02d}", "name": name, "input": {"path": f"src/file_{i}.py"}}]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i:02d}",
             "content": f"# file {i}\n" + "def function_%d(x):\n    return x * %d\n" % (i, i) * 20}]})
    return msgs


def edit(**kw):
    e = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100},
         "keep": {"type": "tool_uses", "value": 2}}
    e.update(kw)
    return {"edits": [e]}


def total_input(u):
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def test_clear_tool_uses_reports_and_shrinks_the_prompt(client):
    msgs = tool_history()
    plain = client.messages.count_tokens(model="m", tools=[READ, LS], messages=msgs).input_tokens
    counted = client.beta.messages.count_tokens(model="m", tools=[READ, LS], messages=msgs,
                                                context_management=edit())
    assert counted.context_management.original_input_tokens == plain
    assert counted.input_tokens < plain - 3 * 200  # three long results are gone
    r = client.beta.messages.create(model="m", max_tokens=8, tools=[READ, LS], messages=msgs,
                                    context_management=edit())
    applied = r.context_management.applied_edits
    assert len(applied) == 1 and applied[0].type == "clear_tool_uses_20250919"
    assert applied[0].cleared_tool_uses == 3
    assert applied[0].cleared_input_tokens == plain - counted.input_tokens
    assert total_input(r.usage) == counted.input_tokens
    # Streamed: message_delta carries the same report.
    with client.beta.messages.stream(model="m", max_tokens=4, tools=[READ, LS], messages=msgs,
                                     context_management=edit()) as s:
        final = s.get_final_message()
    assert final.context_management.applied_edits[0].cleared_tool_uses == 3


def test_trigger_clear_at_least_exclude_and_inputs(client):
    msgs = tool_history(tool_names=["read_file", "list_dir", "read_file", "list_dir", "read_file"])
    plain = client.messages.count_tokens(model="m", tools=[READ, LS], messages=msgs).input_tokens
    # Below the trigger: nothing happens.
    r = client.beta.messages.count_tokens(model="m", tools=[READ, LS], messages=msgs,
                                          context_management=edit(trigger={"type": "input_tokens", "value": plain + 1}))
    assert r.input_tokens == plain
    r = client.beta.messages.create(model="m", max_tokens=2, tools=[READ, LS], messages=msgs,
                                    context_management=edit(trigger={"type": "tool_uses", "value": 10}))
    assert r.context_management.applied_edits == []
    # clear_at_least beyond what can go: not applied, the prompt stays whole.
    r = client.beta.messages.count_tokens(model="m", tools=[READ, LS], messages=msgs,
                                          context_management=edit(clear_at_least={"type": "input_tokens", "value": 100000}))
    assert r.input_tokens == plain
    # exclude_tools: list_dir results stay (2 of the 3 older uses are read_file).
    r = client.beta.messages.create(model="m", max_tokens=2, tools=[READ, LS], messages=msgs,
                                    context_management=edit(exclude_tools=["list_dir"], trigger={"type": "tool_uses", "value": 3}))
    assert r.context_management.applied_edits[0].cleared_tool_uses == 2
    # clear_tool_inputs removes the cleared calls' inputs too: fewer tokens than results alone.
    a = client.beta.messages.count_tokens(model="m", tools=[READ, LS], messages=msgs, context_management=edit())
    b = client.beta.messages.count_tokens(model="m", tools=[READ, LS], messages=msgs,
                                          context_management=edit(clear_tool_inputs=True))
    assert b.input_tokens < a.input_tokens < plain


def test_bad_edits_are_400(client):
    for bad in [{"edits": [{"type": "clear_everything"}]},
                {"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]},
                {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "turns", "value": 3}}]},
                {"edits": "all"}]:
        with pytest.raises(anthropic.BadRequestError):
            client.beta.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                                        context_management=bad)


def signed_thinking(client):
    r = client.messages.create(model="m", max_tokens=60, thinking={"type": "enabled", "budget_tokens": 16},
                               messages=[{"role": "user", "content": "What is 2+2?"}], extra_body={"temperature": 0})
    blocks = [b for b in r.content if b.type == "thinking"]
    assert blocks and blocks[0].thinking, r
    return {"type": "thinking", "thinking": blocks[0].thinking, "signature": blocks[0].signature}


def test_reasoning_of_the_current_tool_loop_is_replayed(client):
    think = signed_thinking(client)
    call = {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.txt"}}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "hello"}]}
    question = {"role": "user", "content": "Read a.txt"}
    with_think = [question, {"role": "assistant", "content": [think, call]}, result]
    without = [question, {"role": "assistant", "content": [call]}, result]
    n_with = client.messages.count_tokens(model="m", tools=[READ], messages=with_think).input_tokens
    n_without = client.messages.count_tokens(model="m", tools=[READ], messages=without).input_tokens
    assert n_with > n_without  # in the loop: replayed
    later = [{"role": "assistant", "content": "It says hello."}, {"role": "user", "content": "Thanks."}]
    n_with = client.messages.count_tokens(model="m", tools=[READ], messages=with_think + later).input_tokens
    n_without = client.messages.count_tokens(model="m", tools=[READ], messages=without + later).input_tokens
    assert n_with == n_without  # an earlier turn's reasoning: dropped
    # clear_thinking keep 0 inside the loop: the reasoning goes, and is counted.
    r = client.beta.messages.create(model="m", max_tokens=2, tools=[READ], messages=with_think,
                                    context_management={"edits": [{"type": "clear_thinking_20251015",
                                                                   "keep": {"type": "thinking_turns", "value": 0}}]})
    applied = r.context_management.applied_edits
    assert applied[0].type == "clear_thinking_20251015" and applied[0].cleared_thinking_turns == 1
    assert applied[0].cleared_input_tokens > 0
    r = client.beta.messages.create(model="m", max_tokens=2, tools=[READ], messages=with_think,
                                    context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})
    assert r.context_management.applied_edits == []
