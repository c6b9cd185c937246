"""OpenAI's Responses API, driven by the `openai` SDK's responses.create against the real server (the session's:
default model, a key required): whole and streamed, a function tool and its output sent back, text.format."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.system

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def client(server, api_key):
    return openai.OpenAI(base_url=server + "/v1", api_key=api_key[1], max_retries=0, timeout=120)


def test_a_response_whole_and_streamed_gives_the_same_greedy_text(client):
    whole = client.responses.create(model=MODEL_ID, input="Name a colour.", instructions="Answer in one word.",
                                    max_output_tokens=12, temperature=0)
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.status in ("completed", "incomplete")
    assert whole.output[0].type == "message" and whole.output_text
    assert whole.usage.input_tokens > 5 and 1 <= whole.usage.output_tokens <= 12
    events = list(client.responses.create(model=MODEL_ID, input="Name a colour.", instructions="Answer in one word.",
                                          max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed",
                                                                                      "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    with client.responses.stream(model=MODEL_ID, input="Name a colour.", instructions="Answer in one word.",
                                 max_output_tokens=12, temperature=0) as stream:  # the SDK's own accumulator
        final = stream.get_final_response()
    assert final.output_text == whole.output_text


def test_a_cut_answer_is_incomplete_with_its_reason(client):
    cut = client.responses.create(model=MODEL_ID, input="Count from one to fifty in words.", max_output_tokens=3,
                                  temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3


def test_a_function_call_and_its_output_round_trip(client):
    first = client.responses.create(model=MODEL_ID, input=[{"role": "user", "content": "Weather in Paris?"}],
                                    tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                    max_output_tokens=60, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    streamed = list(client.responses.create(model=MODEL_ID, input=[{"role": "user", "content": "Weather in Paris?"}],
                                            tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                            max_output_tokens=60, temperature=0, stream=True))
    done = [e.item for e in streamed if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(d.name, d.arguments) for d in done] == [(calls[0].name, calls[0].arguments)]
    # The agent loop's next turn: the call and its output as items (how Codex and the Agents SDK send them).
    follow = client.responses.create(model=MODEL_ID, max_output_tokens=12, temperature=0, tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    assert follow.status in ("completed", "incomplete") and follow.output


def test_text_format_constrains_the_answer(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"],
              "additionalProperties": False}
    answer = client.responses.create(model=MODEL_ID, input="Name a colour as JSON.", max_output_tokens=40,
                                     temperature=0, text={"format": {"type": "json_schema", "name": "colour",
                                                                     "schema": schema}})
    assert isinstance(json.loads(answer.output_text)["colour"], str)


def test_refusals_name_the_responses_fields(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input="hi", previous_response_id="resp_1")
    assert err.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=0)
    assert err.value.body["param"] == "max_output_tokens"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input="hi", tools=[{"type": "custom", "name": "apply_patch"}])
    assert err.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input="hi", tools=[{"type": "namespace", "name": "n", "tools": [
            {"type": "custom", "name": "x"}]}])
    assert err.value.body["param"] == "tools[0].tools[0].type"
    with pytest.raises(openai.BadRequestError) as err:  # found by schemathesis: a 500 before
        client.responses.create(model=MODEL_ID, input="hi", tools=[{"type": {}, "name": "x"}])
    assert err.value.body["param"] == "tools[0].type"


def test_hosted_tools_are_left_out_and_a_namespaces_functions_are_offered(client):
    # What Codex CLI sends: a hosted web_search it always offers, and its sub-agent tools in a namespace.
    weather = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    said = client.responses.create(model=MODEL_ID, input="Weather in Paris?", max_output_tokens=64, tool_choice="required",
                                   tools=[{"type": "web_search", "external_web_access": False},
                                          {"type": "namespace", "name": "tools_v1", "description": "Tools.",
                                           "tools": [weather]}])
    calls = [item for item in said.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
