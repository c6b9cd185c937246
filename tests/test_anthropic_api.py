"""The Anthropic Messages API, driven by the official `anthropic` SDK against the real server."""

from __future__ import annotations

import anthropic
import jsonschema
import pytest

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.system

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def claude(server, api_key):
    return anthropic.Anthropic(base_url=server, api_key=api_key[1], max_retries=0, timeout=120)


def test_a_message(claude):
    msg = claude.messages.create(model=MODEL_ID, max_tokens=12, system="You answer briefly.",
                                 messages=[{"role": "user", "content": "Name a colour."}], extra_body={"temperature": 0})
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL_ID and msg.id.startswith("msg_")
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 10 and 1 <= msg.usage.output_tokens <= 12


def test_a_streamed_message_has_the_messages_event_sequence(claude):
    kinds = [e.type for e in claude.messages.create(model=MODEL_ID, max_tokens=8, extra_body={"temperature": 0}, stream=True,
                                                    messages=[{"role": "user", "content": "Say hello."}])]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.index("content_block_start") < kinds.index("content_block_delta") < kinds.index("content_block_stop")
    with claude.messages.stream(model=MODEL_ID, max_tokens=8, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Say hello."}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.usage.output_tokens >= 1


def test_stop_sequences_report_which_one_stopped(claude):
    ask = [{"role": "user", "content": "Count from one to twenty in words."}]
    free = claude.messages.create(model=MODEL_ID, max_tokens=40, extra_body={"temperature": 0}, messages=ask).content[0].text
    # A stop string from the middle of what the model says at temperature 0: its first place in the text.
    at = next(k for k in range(4, len(free) - 3) if free.find(free[k:k + 3]) == k and free[k:k + 3].strip())
    stop = free[at:at + 3]
    msg = claude.messages.create(model=MODEL_ID, max_tokens=40, extra_body={"temperature": 0}, messages=ask,
                                 stop_sequences=[stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == free[:at]


def test_a_forced_tool_use_is_a_valid_tool_use_block(claude):
    msg = claude.messages.create(model=MODEL_ID, max_tokens=100, extra_body={"temperature": 0}, messages=ASK, tools=[WEATHER],
                                 tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert msg.stop_reason == "tool_use"
    (block,) = [b for b in msg.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, WEATHER["input_schema"])
    with claude.messages.stream(model=MODEL_ID, max_tokens=100, extra_body={"temperature": 0}, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = stream.get_final_message()
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and block.name == "get_weather" and isinstance(block.input, dict)


def test_a_tool_result_turn_continues_and_count_tokens_agrees(claude):
    conversation = ASK + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}]},
    ]
    msg = claude.messages.create(model=MODEL_ID, max_tokens=8, extra_body={"temperature": 0}, messages=conversation, tools=[WEATHER])
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = claude.messages.count_tokens(model=MODEL_ID, messages=conversation, tools=[WEATHER])
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens


def test_errors_are_anthropic_shaped(claude, server):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model=MODEL_ID, max_tokens=8, messages=[])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "messages" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(model="a-model-this-box-lacks", max_tokens=8, messages=ASK)
    assert err.value.body["error"]["type"] == "not_found_error" and MODEL_ID in err.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model=MODEL_ID, max_tokens=8, messages=ASK,
                               tools=[{"name": "f", "input_schema": {"type": "array"}}])
    assert "tools[0].input_schema" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=server, api_key="ec-wrong", max_retries=0).messages.create(
            model=MODEL_ID, max_tokens=8, messages=ASK)
    assert err.value.body["error"]["type"] == "authentication_error"


def test_structured_output_follows_its_schema(claude):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]}
    msg = claude.messages.create(model=MODEL_ID, max_tokens=40, messages=[{"role": "user", "content": "A colour?"}],
                                 output_config={"format": {"type": "json_schema", "schema": schema}})
    import json

    jsonschema.validate(json.loads(msg.content[0].text), schema)


def test_a_bearer_token_works_too(server, api_key):
    bearer = anthropic.Anthropic(base_url=server, auth_token=api_key[1], api_key=None, max_retries=0)
    assert bearer.messages.create(model=MODEL_ID, max_tokens=4, messages=ASK).content


def test_an_agents_6000_token_prompt_with_max_tokens_32000_on_the_default_settings(tmp_path, api_key):
    # What Claude Code sends, to a server started as `make run` starts it (no context or sequence settings): the
    # default model is served at the 8,192 tokens it was trained for, and max_tokens is a ceiling.
    from tests.servers import Proc, everycycle, free_port, ready, wait_for

    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--keys", api_key[0], "--threads", "2",
                           "--run-dir", str(tmp_path)), tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 180, "the default server to become ready", proc)
        client = anthropic.Anthropic(base_url=base, api_key=api_key[1], max_retries=0, timeout=300)
        notes = " ".join(f"Line {i}: the build step {i % 7} copies file{i}.txt to the output folder." for i in range(270))
        msg = client.messages.create(model=MODEL_ID, max_tokens=32000, system="You are a terse coding assistant.",
                                     messages=[{"role": "user", "content": notes + "\nReply with one word: done."}],
                                     extra_body={"temperature": 0})
        assert 5500 <= msg.usage.input_tokens + msg.usage.cache_read_input_tokens <= 8192 - msg.usage.output_tokens
        assert msg.stop_reason in ("end_turn", "max_tokens") and msg.content[0].text
    finally:
        proc.stop()
