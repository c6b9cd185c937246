"""Tool calls against a real server: the default model (SmolLM2's ChatML template: the generic format) and a
tiny random-weight GGUF whose template has a Hermes/Qwen tool section, read through the openai client."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, http_get, ready, wait_for
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.system

WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER_ARGS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                           "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
You may call functions. Their signatures:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{%- for tc in message.tool_calls %}
<tool_call>
{{ {"name": tc.function.name, "arguments": tc.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _tiny_server(d, name: str, template: str, ctx: int = 1024, specials: tuple[str, ...] = ()):
    model = write_tiny_llama(d / f"{name}.gguf", n_ctx=max(2048, ctx), chat_template=template, specials=specials)
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--model", str(model), "--threads", "2", "--workers", "1",
                           "--parallel", "4", "--ctx-size", str(ctx), "--run-dir", str(d)), d / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 60, f"the {name} server", proc)
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def hermes_tiny(tmp_path_factory):
    yield from _tiny_server(tmp_path_factory.mktemp("hermes"), "tiny-hermes", HERMES_TEMPLATE)


@pytest.fixture(scope="module")
def coder_tiny(tmp_path_factory):
    """Qwen3-Coder's own template (tests/templates, from llama.cpp's repository): XML calls."""
    template = (Path(__file__).parent / "templates" / "Qwen-Qwen3-Coder.jinja").read_text()
    # Its system text teaching the XML format is about 2,000 of the tiny tokenizer's tokens.
    yield from _tiny_server(tmp_path_factory.mktemp("coder"), "tiny-coder", template, ctx=4096)


@pytest.fixture(scope="module")
def glm_tiny(tmp_path_factory):
    """GLM 4.5's own template (tests/templates, from llama.cpp's repository): <arg_key>/<arg_value> calls."""
    template = (Path(__file__).parent / "templates" / "zai-org-GLM-4.5.jinja").read_text()
    yield from _tiny_server(tmp_path_factory.mktemp("glm"), "tiny-glm", template, ctx=4096)


@pytest.fixture(scope="module")
def deepseek_tiny(tmp_path_factory):
    """DeepSeek V3.1's own template (tests/templates, from llama.cpp's repository): NAME<｜tool▁sep｜>JSON calls."""
    template = (Path(__file__).parent / "templates" / "deepseek-ai-DeepSeek-V3.1.jinja").read_text()
    yield from _tiny_server(tmp_path_factory.mktemp("deepseek"), "tiny-deepseek", template, ctx=4096)


@pytest.fixture(scope="module")
def harmony_tiny(tmp_path_factory):
    """gpt-oss's own template (tests/templates, from llama.cpp) and its harmony markers as the vocabulary's control
    tokens: llama.cpp renders the channel markers as text and ends a generation at <|return|> or <|call|>."""
    from tests.tiny_gguf import HARMONY_SPECIALS

    template = (Path(__file__).parent / "templates" / "openai-gpt-oss-120b.jinja").read_text()
    yield from _tiny_server(tmp_path_factory.mktemp("harmony"), "tiny-harmony", template, ctx=4096,
                            specials=HARMONY_SPECIALS)


def _required_calls(client, model: str, seeds, **extra):
    def one(seed):
        return client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                              parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=200,
                                              **extra)
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, seeds))


# A raw (unquoted) string's length as llama.cpp's grammar counts it: it reads a lead byte and whatever byte follows
# as one character, where Python's decoder sees invalid UTF-8 (one U+FFFD per byte). A random-weight model writes
# such bytes; a real one writes text. So raw strings are checked with each run of U+FFFD as at most one character.
RAW_STRING_ARGS = {**WEATHER_ARGS, "properties": {**WEATHER_ARGS["properties"], "city": {"type": "string"}}}


def _check_call(resp, raw_strings: bool = False):
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather" and raw_strings:
        jsonschema.validate(args, RAW_STRING_ARGS)
        assert len(re.sub("\ufffd+", "?", args["city"])) <= WEATHER_ARGS["properties"]["city"]["maxLength"], args
    elif call.function.name == "get_weather":
        jsonschema.validate(args, WEATHER_ARGS)
    else:
        assert call.function.name == "get_time" and args == {}
    return call.function.name


def test_a_required_call_always_parses_with_the_default_model(client):
    names = [_check_call(r) for r in _required_calls(client, MODEL_ID, range(100))]
    assert set(names) <= {"get_weather", "get_time"}


def test_parallel_required_calls_end_or_come_back_as_calls_when_max_tokens_cuts_them(client):
    """The review: with parallel calls allowed (the default) the default model repeated the same call until
    max_tokens ran out in 4 of 10 seeds at temperature 0.7, and the answer carried no tool_calls, only the cut
    JSON as content. Now the grammar ends after MAX_PARALLEL_CALLS calls, and an answer cut by max_tokens keeps
    its whole calls (finish_reason "length" says one was cut)."""
    from host_runtime.serving.tool_calls import MAX_PARALLEL_CALLS

    def one(seed):
        return client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS[:1], tool_choice="required",
                                              temperature=0.7, seed=seed, max_tokens=max_tokens)
    # Room for far more than MAX_PARALLEL_CALLS calls: a model that repeats reaches the grammar's end first.
    max_tokens = 600
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(10)))
    for r in answers:
        choice = r.choices[0]
        assert choice.message.tool_calls, choice   # never the cut JSON as content alone
        assert len(choice.message.tool_calls) <= MAX_PARALLEL_CALLS
        assert choice.finish_reason == "tool_calls" and r.usage.completion_tokens < max_tokens, choice
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER_ARGS)
    # Cut by max_tokens instead, the whole calls before the cut one still come back as calls.
    max_tokens = 40
    with ThreadPoolExecutor(4) as pool:
        cut = [r.choices[0] for r in pool.map(one, range(10))]
    for choice in cut:
        assert choice.message.tool_calls or choice.finish_reason == "length", choice
        assert choice.finish_reason in ("tool_calls", "length"), choice
    assert any(c.finish_reason == "length" and c.message.tool_calls for c in cut), cut


def test_a_required_call_always_parses_with_a_hermes_template(hermes_tiny):
    names = [_check_call(r) for r in _required_calls(hermes_tiny, "tiny-hermes", range(100))]
    assert set(names) <= {"get_weather", "get_time"}


@pytest.mark.parametrize("server,model", [("coder_tiny", "tiny-coder"), ("glm_tiny", "tiny-glm")])
def test_a_required_call_always_parses_with_xml_call_templates(request, server, model):
    """Qwen3-Coder's and GLM's XML calls came back as plain text (#34): constrained by the XML grammar, every answer
    of a random-weight model is a call of an offered tool whose arguments fit its schema (city at most 20
    characters, unit one of the enum's)."""
    coder_tiny = request.getfixturevalue(server)
    names = [_check_call(r, raw_strings=True) for r in _required_calls(coder_tiny, model, range(100))]
    assert set(names) <= {"get_weather", "get_time"}
    parallel = coder_tiny.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                                  tool_choice="required", temperature=1.0, seed=3, max_tokens=400)
    assert parallel.choices[0].message.tool_calls and parallel.choices[0].finish_reason in ("tool_calls", "length")
    # The Messages API reads the same calls as tool_use blocks.
    import anthropic

    messages = anthropic.Anthropic(base_url=str(coder_tiny.base_url).removesuffix("/v1/"), api_key="unused",
                                   max_retries=0).messages
    said = messages.create(model=model, max_tokens=200, messages=ASK, tool_choice={"type": "any"},
                           tools=[{"name": t["function"]["name"], "description": t["function"]["description"],
                                   "input_schema": t["function"]["parameters"]} for t in TOOLS])
    (use,) = [b for b in said.content if b.type == "tool_use"]
    assert said.stop_reason == "tool_use" and use.name in ("get_weather", "get_time")
    if use.name == "get_weather":
        jsonschema.validate(use.input, RAW_STRING_ARGS)


def _streamed_required_call(client, model: str) -> tuple[dict, str, str | None]:
    """A streamed required call's (calls by index, {name, arguments} as the deltas built them; content; finish)."""
    stream = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                            temperature=1.0, seed=5, max_tokens=300, stream=True)
    calls, content, finish = {}, "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return calls, content, finish


def test_a_required_call_always_parses_with_deepseek_v31s_template(deepseek_tiny):
    """DeepSeek V3.1's own format end to end (#34; its parsing: test_tool_calls_logic): constrained by its grammar
    (NAME<｜tool▁sep｜>JSON), every answer of a random-weight model is a call of an offered tool whose arguments fit
    its schema; streamed, the calls arrive as tool_call deltas and no marker leaks into the content."""
    names = [_check_call(r) for r in _required_calls(deepseek_tiny, "tiny-deepseek", range(40))]
    assert set(names) <= {"get_weather", "get_time"}
    calls, content, finish = _streamed_required_call(deepseek_tiny, "tiny-deepseek")
    assert calls and "tool" not in content and finish in ("tool_calls", "length")
    assert all(c["name"] in ("get_weather", "get_time") for c in calls.values())


def test_a_required_call_always_parses_with_gpt_oss_harmony(harmony_tiny):
    """gpt-oss's calls came back as plain text (#34): constrained to one commentary message to a function, every
    answer of a random-weight model with gpt-oss's template and markers is a call of an offered tool whose JSON
    arguments fit its schema, whole and streamed; no channel marker reaches the content."""
    # Strings checked as raw ones (RAW_STRING_ARGS above): this model writes byte tokens that are not UTF-8.
    names = [_check_call(r, raw_strings=True) for r in _required_calls(harmony_tiny, "tiny-harmony", range(40))]
    assert set(names) <= {"get_weather", "get_time"}
    calls, content, finish = _streamed_required_call(harmony_tiny, "tiny-harmony")
    assert calls and "<|" not in content and finish in ("tool_calls", "length")
    assert all(c["name"] in ("get_weather", "get_time") for c in calls.values())
    # A conversation with a call and its result renders with the template, and the answer holds no marker.
    conversation = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 degrees, sunny"}]
    resp = harmony_tiny.chat.completions.create(model="tiny-harmony", messages=conversation, tools=TOOLS,
                                                temperature=0, max_tokens=8)
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls") and resp.usage.prompt_tokens > 100


def test_a_named_call_is_that_function(client):
    resp = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, temperature=0, max_tokens=200,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert _check_call(resp) == "get_weather"
    assert resp.choices[0].message.content is None


def test_a_streamed_call_arrives_as_tool_call_deltas(client):
    stream = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, temperature=0, max_tokens=200, stream=True)
    calls, finish, content = {}, None, ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == "" and calls
    for entry in calls.values():
        assert entry["id"].startswith("call_") and entry["name"] in ("get_weather", "get_time")
        json.loads(entry["arguments"])


def test_a_conversation_with_a_tool_result_continues(client, hermes_tiny, coder_tiny, glm_tiny, deepseek_tiny):
    conversation = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 degrees, sunny"},
    ]
    for c, model in ((client, MODEL_ID), (hermes_tiny, "tiny-hermes"), (coder_tiny, "tiny-coder"),
                     (glm_tiny, "tiny-glm"), (deepseek_tiny, "tiny-deepseek")):
        resp = c.chat.completions.create(model=model, messages=conversation, tools=TOOLS, temperature=0, max_tokens=8)
        assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert resp.usage.prompt_tokens > 20


def test_tool_choice_none_and_no_tools_answer_in_text(client):
    resp = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice="none",
                                          temperature=0, max_tokens=8)
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].message.content


@pytest.mark.parametrize("tools,param", [
    ([TOOLS[0], {"type": "function", "function": {"name": "bad name"}}], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], "tools[0].function.parameters"),
    ([{"type": "retrieval"}], "tools[0]"),
])
def test_a_malformed_tool_is_a_400_naming_it(client, tools, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=tools, max_tokens=4)
    assert err.value.body["param"] == param


def test_cached_tokens_report_the_prefix_cache_hit(client):
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 40}, {"role": "user", "content": "Hi"}]
    client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=2)
    again = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 128  # at least one whole prefill chunk


def test_tokenize_detokenize_and_one_model(server, api_key):
    import urllib.request

    def post(path, doc):
        req = urllib.request.Request(server + path, data=json.dumps(doc).encode(),
                                     headers={"Authorization": f"Bearer {api_key[1]}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    tokens = post("/tokenize", {"content": "Hello world"})["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert post("/detokenize", {"tokens": tokens})["content"] == "Hello world"
    pieces = post("/tokenize", {"content": "Hello world", "with_pieces": True})["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world" and [p["id"] for p in pieces] == tokens
    status, body = http_get(server + f"/v1/models/{MODEL_ID}", key=api_key[1])
    model = json.loads(body)
    assert status == 200 and model["id"] == MODEL_ID and model["context_length"] == 2048
    assert http_get(server + "/v1/models/nope", key=api_key[1])[0] == 404
