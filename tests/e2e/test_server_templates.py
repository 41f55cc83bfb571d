"""Models whose chat template is neither ChatML nor Gemma are prompted through their own template,
rendered by mererun's Jinja engine (ChatFamily::kTemplate), over a real server and socket.

SmolLM2's file is rewritten with another model's template (Llama 3.1's, Mistral Nemo's; from
tests/fixtures/jinja/templates) in its metadata. The prompt the server logs must be exactly what
python3 jinja2 renders from that template for the same conversation (the BOS left to the
tokenizer), and a template's raise_exception must reach the client as a 400 naming its message,
with the server still serving."""
import json
import struct
from datetime import datetime
from pathlib import Path

import pytest
import requests

from mererun_server import ServerProcess

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "tests" / "fixtures" / "jinja" / "templates"

# GGUF value types (the spec's gguf_type): sizes of the fixed-width ones.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(buf, off, kind):
    if kind in _FIXED:
        return off + _FIXED[kind]
    if kind == 8:  # string: u64 length + bytes
        (n,) = struct.unpack_from("<Q", buf, off)
        return off + 8 + n
    if kind == 9:  # array: u32 element type, u64 count, elements
        elem, count = struct.unpack_from("<IQ", buf, off)
        off += 12
        if elem in _FIXED:
            return off + _FIXED[elem] * count
        for _ in range(count):
            off = _skip_value(buf, off, elem)
        return off
    raise ValueError(f"GGUF value type {kind}")


def with_template(src: Path, dst: Path, template: str):
    """Copies the GGUF file src to dst with tokenizer.chat_template replaced (or added): the
    metadata is rewritten, the tensor infos kept (their offsets are relative to the data
    section), and the data section re-aligned."""
    buf = src.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF", src
    off = 24
    kvs = []
    alignment = 32
    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", buf, off)
        key = buf[off + 8:off + 8 + klen].decode()
        off += 8 + klen
        (kind,) = struct.unpack_from("<I", buf, off)
        end = _skip_value(buf, off + 4, kind)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, off + 4)
        if key != "tokenizer.chat_template":
            kvs.append(buf[start:end])
        off = end
    infos_start = off
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", buf, off)
        off += 8 + nlen
        (n_dims,) = struct.unpack_from("<I", buf, off)
        off += 4 + 8 * n_dims + 4 + 8
    infos = buf[infos_start:off]
    data_start = (off + alignment - 1) // alignment * alignment
    key = b"tokenizer.chat_template"
    value = template.encode()
    kvs.append(struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(value)) + value)
    head = struct.pack("<4sIQQ", magic, version, n_tensors, len(kvs)) + b"".join(kvs) + infos
    pad = (-len(head)) % alignment
    with open(dst, "wb") as f:
        f.write(head + b"\0" * pad)
        f.write(memoryview(buf)[data_start:])


def jinja2_render(template: str, messages, **ctx) -> str:
    """What transformers' apply_chat_template renders (its jinja2 environment and tojson)."""
    jinja2 = pytest.importorskip("jinja2")
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template).render(messages=messages, **ctx)


def _serve(mererun_bin, model_path, tmp_path, template_name, **kw):
    src = Path(model_path("smollm2-135m-instruct"))
    dst = tmp_path / f"smollm2-{template_name}.gguf"
    template = (TEMPLATES / template_name).read_text()
    with_template(src, dst, template)
    return template, ServerProcess(mererun_bin, str(dst), "-c", "2048", "--no-warmup", **kw)


def test_llama31_template_renders_the_prompt_as_jinja2_does(mererun_bin, model_path, tmp_path):
    template, s = _serve(mererun_bin, model_path, tmp_path, "meta-llama-Llama-3.1-8B-Instruct.jinja",
                         env={"MERERUN_LOG": "debug"})
    try:
        body = {"model": "m", "max_tokens": 3, "temperature": 0, "system": "Be brief.",
                "messages": [{"role": "user", "content": "Name a colour."},
                             {"role": "assistant", "content": "Blue."},
                             {"role": "user", "content": "Another <|eot_id|> one."}]}
        r = requests.post(s.base_url + "/v1/messages", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["output_tokens"] >= 1
        want = jinja2_render(template, [{"role": "system", "content": "Be brief."}] + body["messages"],
                             add_generation_prompt=True, bos_token="<|im_start|>", eos_token="<|im_end|>")
        # SmolLM2's BOS is <|im_start|>; the template writes {{ bos_token }} first and the server
        # leaves it to the tokenizer.
        assert want.startswith("<|im_start|>")
        want = want[len("<|im_start|>"):]
        assert "Cutting Knowledge Date" in want and "<|start_header_id|>user<|end_header_id|>" in want
        assert want in s.log(), s.log()[-3000:]
    finally:
        s.stop()


def test_a_template_that_refuses_gets_a_400_and_the_server_keeps_serving(mererun_bin, model_path, tmp_path):
    _, s = _serve(mererun_bin, model_path, tmp_path, "mistralai-Mistral-Nemo-Instruct-2407.jinja")
    try:
        # Mistral's template requires 9-character alphanumeric tool-call ids.
        bad = {"model": "m", "max_tokens": 2, "messages": [
            {"role": "user", "content": "Read a.txt"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"p\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
            "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]}
        r = requests.post(s.base_url + "/v1/chat/completions", json=bad, timeout=60)
        assert r.status_code == 400, r.text
        assert "Tool call IDs should be alphanumeric strings with length 9" in r.json()["error"]["message"]
        ok = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
        r = requests.post(s.base_url + "/v1/chat/completions", json=ok, timeout=120)
        assert r.status_code == 200, r.text
        status, health = s.health()
        assert status == 200 and health["active"] == 0
    finally:
        s.stop()


def test_qwen3_native_reasoning_follows_the_thinking_switch(mererun_bin, model_path, tmp_path):
    """Qwen3's template takes enable_thinking: the model reasons without being told. The server
    does not add its prompted-reasoning instruction for it; with thinking off it opens the turn
    with the template's empty <think> section (the model answers at once), with thinking on it
    opens the section. Both prompts must be exactly what jinja2 renders from Qwen3's own template
    (SmolLM2 shares its ChatML tokens, so the server uses its ChatML format for the file)."""
    template, s = _serve(mererun_bin, model_path, tmp_path, "Qwen-Qwen3-0.6B.jinja",
                         env={"MERERUN_LOG": "debug"})
    try:
        messages = [{"role": "user", "content": "Name a colour."}]
        off = {"model": "m", "max_tokens": 4, "temperature": 0, "messages": messages}
        r = requests.post(s.base_url + "/v1/messages", json=off, timeout=120)
        assert r.status_code == 200, r.text
        assert all(b["type"] == "text" for b in r.json()["content"]), r.json()
        want_off = jinja2_render(template, messages, add_generation_prompt=True, enable_thinking=False)
        assert want_off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), want_off
        log = s.log()
        assert "prompt:\n" + want_off in log, log[-3000:]
        on = {"model": "m", "messages": messages, "thinking": {"type": "enabled", "budget_tokens": 1024}}
        r = requests.post(s.base_url + "/v1/messages/count_tokens", json=on, timeout=60)
        assert r.status_code == 200, r.text
        want_on = jinja2_render(template, messages, add_generation_prompt=True, enable_thinking=True)
        assert want_on.endswith("<|im_start|>assistant\n"), want_on
        log = s.log()
        assert "prompt:\n" + want_on + "<think>\n" in log, log[-3000:]
        assert "think step by step" not in log  # the prompted-reasoning instruction is not added
    finally:
        s.stop()
