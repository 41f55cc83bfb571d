"""Grammar-constrained decoding through the official SDKs: forced tool calls (`any`, `tool`,
streamed input_json_delta, OpenAI tool_calls) and structured outputs (Anthropic
output_config.format, OpenAI response_format json_schema / json_object) on SmolLM2-135M, the
smallest catalog model, which without constraints fails every one of these checks. 20 runs each
with the model's default sampling (what a client gets) must all be valid and complete; runs at
temperature 1 (every token has a chance, so a missing constraint shows) must be valid whenever
they complete (this 135M model can ramble inside a string until max_tokens at T = 1); lazy tool calls under `auto` on
Qwen2.5-Coder-0.5B; schemas outside the supported subset refused with the keyword named.

The arguments are checked against the schema here, independently of the server's own
validation (jsonschema is not a dependency: the checks are explicit)."""
import json

import anthropic
import openai
import pytest

from mererun_server import ServerProcess

SAMPLED = {"temperature": 1.0}
RUNS = 20
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a location.",
    "input_schema": {
        "type": "object",
        "properties": {
            "location": {"type": "object",
                         "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                         "required": ["city"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["location", "unit"],
    },
}
CLOCK = {"name": "get_time", "description": "The current time in a time zone.",
         "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}
QUESTION = "What is the weather in Paris, France right now?"
CONTACT = {"type": "object", "additionalProperties": False, "required": ["name", "email", "plan", "demo"],
           "properties": {"name": {"type": "string"}, "email": {"type": "string"},
                          "plan": {"type": "string", "enum": ["free", "pro", "enterprise"]},
                          "demo": {"type": "boolean"}, "seats": {"type": ["integer", "null"]}}}
EMAIL = "Extract the contact: John Smith (john@example.com) wants the Enterprise plan and a demo next week."


def check_weather(inp):
    assert set(inp) <= {"location", "unit", "days"}, inp
    assert isinstance(inp["location"], dict) and isinstance(inp["location"]["city"], str), inp
    assert set(inp["location"]) <= {"city", "country"}, inp
    assert all(isinstance(v, str) for v in inp["location"].values()), inp
    assert inp["unit"] in ("celsius", "fahrenheit"), inp
    assert "days" not in inp or (isinstance(inp["days"], int) and not isinstance(inp["days"], bool)), inp


def check_clock(inp):
    assert set(inp) == {"tz"} and isinstance(inp["tz"], str), inp


def check_contact(v):
    assert isinstance(v, dict) and set(v) <= set(CONTACT["properties"]), v
    assert all(k in v for k in CONTACT["required"]), v
    assert isinstance(v["name"], str) and isinstance(v["email"], str) and isinstance(v["demo"], bool), v
    assert v["plan"] in ("free", "pro", "enterprise"), v
    assert "seats" not in v or v["seats"] is None or (isinstance(v["seats"], int) and not isinstance(v["seats"], bool)), v


@pytest.fixture(scope="module")
def smol(mererun_bin, model_path):
    model_path("smollm2-135m-instruct")
    s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "2048")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(smol):
    return anthropic.Anthropic(base_url=smol.base_url, api_key="unused", max_retries=0, timeout=120)


def sampling(i):
    """Runs 0..RUNS-1: the model's default sampling, seeded; then temperature 1."""
    return {"seed": i} if i < RUNS else {"temperature": 1.0, "seed": i}


def test_forced_tool_20_of_20_sampled(client):
    complete_t1 = 0
    for i in range(RUNS + 10):
        msg = client.messages.create(model="m", max_tokens=120, tools=[WEATHER, CLOCK],
                                     tool_choice={"type": "tool", "name": "get_weather"},
                                     messages=[{"role": "user", "content": QUESTION}], extra_body=sampling(i))
        uses = [b for b in msg.content if b.type == "tool_use"]
        if i >= RUNS and msg.stop_reason == "max_tokens":
            continue
        complete_t1 += i >= RUNS
        assert msg.stop_reason == "tool_use" and len(uses) == 1, (i, msg)
        assert uses[0].name == "get_weather"
        check_weather(uses[0].input)
    assert complete_t1 >= 5


def test_any_tool_20_of_20_sampled_and_streamed(client):
    complete_t1 = 0
    for i in range(RUNS + 10):
        with client.messages.stream(model="m", max_tokens=120, tools=[WEATHER, CLOCK], tool_choice={"type": "any"},
                                    messages=[{"role": "user", "content": QUESTION if i % 2 else "What time is it in Tokyo?"}],
                                    extra_body=sampling(i)) as stream:
            final = stream.get_final_message()
        uses = [b for b in final.content if b.type == "tool_use"]
        if i >= RUNS and final.stop_reason == "max_tokens":
            continue
        complete_t1 += i >= RUNS
        assert final.stop_reason == "tool_use" and len(uses) == 1, (i, final)
        (check_weather if uses[0].name == "get_weather" else check_clock)(uses[0].input)
    assert complete_t1 >= 5


def test_openai_forced_tool_calls_20_of_20(smol):
    oa = openai.OpenAI(base_url=smol.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                             "parameters": WEATHER["input_schema"]}}
    for i in range(RUNS):
        r = oa.chat.completions.create(model="m", max_tokens=120, seed=i, tools=[tool],
                                       tool_choice="required" if i % 2 else {"type": "function", "function": {"name": "get_weather"}},
                                       messages=[{"role": "user", "content": QUESTION}])
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (i, choice)
        assert choice.message.tool_calls[0].function.name == "get_weather"
        check_weather(json.loads(choice.message.tool_calls[0].function.arguments))


def test_structured_output_20_of_20(client, smol):
    oa = openai.OpenAI(base_url=smol.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for i in range(RUNS):
        if i % 2 == 0:
            msg = client.messages.create(model="m", max_tokens=200, messages=[{"role": "user", "content": EMAIL}],
                                         extra_body={"output_config": {"format": {"type": "json_schema", "schema": CONTACT}}})
            text = "".join(b.text for b in msg.content if b.type == "text")
            stop = msg.stop_reason
            assert stop == "end_turn", (i, msg)
        else:
            r = oa.chat.completions.create(model="m", max_tokens=200, seed=i,
                                           messages=[{"role": "user", "content": EMAIL}],
                                           response_format={"type": "json_schema", "json_schema": {"name": "contact", "schema": CONTACT, "strict": True}})
            text = r.choices[0].message.content
            assert r.choices[0].finish_reason == "stop", (i, r)
        check_contact(json.loads(text))
    r = oa.chat.completions.create(model="m", max_tokens=120, temperature=1.0, response_format={"type": "json_object"},
                                   messages=[{"role": "user", "content": "Describe a cat as JSON."}])
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_unsupported_schema_keywords_are_named(client):
    strict_tool = dict(CLOCK, strict=True, input_schema={"type": "object", "properties": {"tz": {"type": "string", "format": "iri"}}})
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=20, tools=[strict_tool], tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "time?"}])
    assert "$.properties.tz.format" in str(e.value)
    lookahead = dict(CLOCK, strict=True, input_schema={"type": "object", "properties": {"tz": {"type": "string", "pattern": "a(?=b)"}}})
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=20, tools=[lookahead], tool_choice={"type": "any"},
                               messages=[{"role": "user", "content": "time?"}])
    assert "$.properties.tz.pattern" in str(e.value) and "lookaround" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=20, tools=[dict(CLOCK, input_schema={"type": "object", "not": {}})],
                               tool_choice={"type": "tool", "name": "get_time"}, messages=[{"role": "user", "content": "time?"}])
    assert "$.not" in str(e.value)
    # Not strict: a value bound is not enforced, the call is still constrained.
    # Greedy: sampled at T=1 the unbounded string sometimes ran past max_tokens (stop 26, one run
    # in three on Zen 4), which says nothing about the schema.
    loose = dict(CLOCK, input_schema={"type": "object", "properties": {"tz": {"type": "string", "minimum": 3}}, "required": ["tz"]})
    msg = client.messages.create(model="m", max_tokens=100, tools=[loose], tool_choice={"type": "any"},
                                 messages=[{"role": "user", "content": "time in Oslo?"}], extra_body={"temperature": 0})
    assert msg.stop_reason == "tool_use", msg
    assert isinstance(next(b for b in msg.content if b.type == "tool_use").input["tz"], str)


def test_patterns_and_formats_hold_in_sampled_outputs(client, smol):
    """JSON Schema `pattern` (unanchored unless ^ / $) and `format` constrain the string's text,
    number and integer bounds the numbers: every sampled tool call and structured output of the smallest
    model matches."""
    import re
    import uuid
    from datetime import date
    booking = {"name": "book", "description": "Book a room.", "strict": True,
               "input_schema": {"type": "object", "additionalProperties": False, "required": ["code", "day", "ref", "note", "nights"],
                                "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"},
                                               "day": {"type": "string", "format": "date"},
                                               "ref": {"type": "string", "format": "uuid"},
                                               "note": {"type": "string", "pattern": "^[a-z ]{0,20}ok$"},
                                               "nights": {"type": "integer", "minimum": 2, "exclusiveMaximum": 15}}}}
    oa = openai.OpenAI(base_url=smol.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ip = {"type": "object", "additionalProperties": False, "required": ["host", "when", "load"],
          "properties": {"host": {"type": "string", "format": "ipv4"}, "when": {"type": "string", "format": "date-time"},
                         "load": {"type": "number", "minimum": -0.5, "exclusiveMaximum": 1}}}
    calls = outputs = 0
    for i in range(5):
        msg = client.messages.create(model="m", max_tokens=200, tools=[booking], tool_choice={"type": "tool", "name": "book"},
                                     messages=[{"role": "user", "content": "Book room ABC-12 for tomorrow."}],
                                     extra_body={"temperature": 1.0, "seed": i})
        if msg.stop_reason == "max_tokens":  # a long sampled string: says nothing about the pattern
            continue
        args = next(b for b in msg.content if b.type == "tool_use").input
        assert re.fullmatch(r"[A-Z]{3}-\d{2}", args["code"]), args
        date.fromisoformat(args["day"])  # a real calendar date, or ValueError
        uuid.UUID(args["ref"])
        assert re.fullmatch(r"[a-z ]{0,20}ok", args["note"]), args
        assert isinstance(args["nights"], int) and 2 <= args["nights"] <= 14, args
        calls += 1
    for i in range(5):
        r = oa.chat.completions.create(model="m", max_tokens=120, temperature=1.0, seed=i,
                                       messages=[{"role": "user", "content": "Which server, and when?"}],
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "s", "strict": True, "schema": ip}})
        if r.choices[0].finish_reason != "stop":
            continue
        v = json.loads(r.choices[0].message.content)
        assert all(0 <= int(x) <= 255 for x in v["host"].split(".")) and v["host"].count(".") == 3, v
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", v["when"]), v
        assert isinstance(v["load"], (int, float)) and -0.5 <= v["load"] < 1, v
        outputs += 1
    print("complete:", calls, outputs)
    assert calls >= 3 and outputs >= 2, (calls, outputs)


def test_auto_calls_are_valid_whenever_the_model_calls(mererun_bin, model_path):
    """Under tool_choice auto the model decides whether to call; every call it starts (tagged or
    in a ```json fence) is completed under the grammar, so it is always a valid tool_use."""
    model_path("qwen2.5-coder-0.5b-instruct")
    s = ServerProcess(mererun_bin, "qwen2.5-coder-0.5b-instruct", "-c", "2048")
    try:
        c = anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0, timeout=120)
        calls = 0
        for i in range(8):
            msg = c.messages.create(model="m", max_tokens=120, tools=[WEATHER, CLOCK],
                                    messages=[{"role": "user", "content": QUESTION + " Use a tool."}], extra_body=SAMPLED)
            uses = [b for b in msg.content if b.type == "tool_use"]
            text = "".join(b.text for b in msg.content if b.type == "text")
            assert "<tool_call>" not in text, msg  # a started call never ends up as text
            for u in uses:
                (check_weather if u.name == "get_weather" else check_clock)(u.input)
            calls += len(uses)
            if uses:
                assert msg.stop_reason == "tool_use"
        assert calls >= 4  # the model does call (and every call was valid)
    finally:
        s.stop()
