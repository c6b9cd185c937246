"""Bad input and bad credentials: a 4xx with an OpenAI-style body naming the field, and the server keeps serving."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.system  # every test here starts processes or loads the model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
MSGS = [{"role": "user", "content": "hi"}]


def post_raw(server: str, path: str, data: bytes, key: str | None, headers: dict | None = None):
    h = {"Content-Type": "application/json", **(headers or {})}
    if key:
        h["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(server + path, data=data, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def assert_openai_error(body: dict, param: str | None):
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and "Traceback" not in err["message"]
    assert err["param"] == param


BAD_CHAT = [
    ("wrong type: messages", {"model": MODEL_ID, "messages": "hello"}, "messages"),
    ("missing messages", {"model": MODEL_ID}, "messages"),
    ("empty messages", {"model": MODEL_ID, "messages": []}, "messages"),
    ("unknown role", {"model": MODEL_ID, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("message not an object", {"model": MODEL_ID, "messages": ["hi"]}, "messages[0]"),
    ("content wrong type", {"model": MODEL_ID, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("image part", {"model": MODEL_ID, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content[0].image_url"),
    ("max_tokens zero", {"model": MODEL_ID, "messages": MSGS, "max_tokens": 0}, "max_tokens"),
    ("max_tokens negative", {"model": MODEL_ID, "messages": MSGS, "max_tokens": -5}, "max_tokens"),
    ("max_tokens string", {"model": MODEL_ID, "messages": MSGS, "max_tokens": "10"}, "max_tokens"),
    ("max_tokens bool", {"model": MODEL_ID, "messages": MSGS, "max_tokens": True}, "max_tokens"),
    ("temperature too high", {"model": MODEL_ID, "messages": MSGS, "temperature": 7}, "temperature"),
    ("temperature string", {"model": MODEL_ID, "messages": MSGS, "temperature": "hot"}, "temperature"),
    ("top_p out of range", {"model": MODEL_ID, "messages": MSGS, "top_p": 1.5}, "top_p"),
    ("n past ceiling", {"model": MODEL_ID, "messages": MSGS, "n": 50}, "n"),
    ("top_logprobs past ceiling", {"model": MODEL_ID, "messages": MSGS, "logprobs": True, "top_logprobs": 99},
     "top_logprobs"),
    ("top_logprobs without logprobs", {"model": MODEL_ID, "messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    ("too many stop strings", {"model": MODEL_ID, "messages": MSGS, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("stop wrong type", {"model": MODEL_ID, "messages": MSGS, "stop": 3}, "stop"),
    ("unsupported response_format", {"model": MODEL_ID, "messages": MSGS, "response_format": {"type": "xml"}},
     "response_format.type"),
    ("json_schema without schema", {"model": MODEL_ID, "messages": MSGS,
                                    "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ("stream_options without stream", {"model": MODEL_ID, "messages": MSGS, "stream_options": {"include_usage": True}},
     "stream_options"),
    ("penalty out of range", {"model": MODEL_ID, "messages": MSGS, "presence_penalty": 5}, "presence_penalty"),
    ("a tool without a function", {"model": MODEL_ID, "messages": MSGS, "tools": [{"type": "function"}]},
     "tools[0]"),
    ("the legacy functions", {"model": MODEL_ID, "messages": MSGS, "functions": [{"name": "f"}]}, "functions"),
    ("a tool message without its call id", {"model": MODEL_ID, "messages": MSGS + [{"role": "tool", "content": "x"}]},
     "messages[1].tool_call_id"),
    ("tool calls on a user message", {"model": MODEL_ID, "messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls"),
    ("tool_choice naming a missing tool", {"model": MODEL_ID, "messages": MSGS, "tool_choice": {
        "type": "function", "function": {"name": "f"}}}, "tool_choice.function.name"),
    ("logit_bias key not an id", {"model": MODEL_ID, "messages": MSGS, "logit_bias": {"abc": 1}}, "logit_bias"),
    ("logit_bias value out of range", {"model": MODEL_ID, "messages": MSGS, "logit_bias": {"5": 500}}, "logit_bias"),
    ("logit_bias too many", {"model": MODEL_ID, "messages": MSGS, "logit_bias": {str(i): 1 for i in range(301)}},
     "logit_bias"),
    ("logit_bias past the vocabulary", {"model": MODEL_ID, "messages": MSGS, "logit_bias": {"99999999": -100}},
     "logit_bias"),
    ("logit_bias key a superscript digit", {"model": MODEL_ID, "messages": MSGS, "logit_bias": {"\u00b2": 1}},
     "logit_bias"),
    ("logit_bias key an Arabic-Indic digit", {"model": MODEL_ID, "messages": MSGS, "logit_bias": {"\u0663": 1}},
     "logit_bias"),
    # The schema that crashed llama.cpp: a repetition past its limit made the grammar NULL, added unchecked.
    ("json_schema maxLength past the repetition limit", {"model": MODEL_ID, "messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 100000}}}},
     "response_format.json_schema.schema.maxLength"),
    ("json_schema pattern repetition past the limit", {"model": MODEL_ID, "messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a{1,5000}$"}}}},
     "response_format.json_schema.schema.pattern"),
    ("json_schema self-referencing $ref", {"model": MODEL_ID, "messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}}},
     "response_format.json_schema.schema"),
    ("json_schema root $ref", {"model": MODEL_ID, "messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
     "response_format.json_schema.schema"),
    ("json_schema nested too deep", {"model": MODEL_ID, "messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": json.loads('{"items": ' * 30 + '{}' + '}' * 30)}}},
     "response_format.json_schema.schema"),
    ("seed wrong type", {"model": MODEL_ID, "messages": MSGS, "seed": 1.5}, "seed"),
    ("stream wrong type", {"model": MODEL_ID, "messages": MSGS, "stream": "yes"}, "stream"),
]


BAD_COMPLETIONS = [
    ("missing prompt", {"model": MODEL_ID}, "prompt"),
    ("empty prompt", {"model": MODEL_ID, "prompt": ""}, "prompt"),
    ("prompt number", {"model": MODEL_ID, "prompt": 12}, "prompt"),
    ("several prompts", {"model": MODEL_ID, "prompt": ["a", "b"]}, "prompt"),
    ("logprobs past ceiling", {"model": MODEL_ID, "prompt": "x", "logprobs": 50}, "logprobs"),
    ("echo", {"model": MODEL_ID, "prompt": "x", "echo": True}, "echo"),
    ("best_of", {"model": MODEL_ID, "prompt": "x", "best_of": 3}, "best_of"),
    ("stream with n past ceiling", {"model": MODEL_ID, "prompt": "x", "n": 5, "stream": True}, "n"),
]


BAD_EMBEDDINGS = [
    ("missing input", {"model": MODEL_ID}, "input"),
    ("input number", {"model": MODEL_ID, "input": 3}, "input"),
    ("empty list", {"model": MODEL_ID, "input": []}, "input"),
    ("empty string", {"model": MODEL_ID, "input": ""}, "input"),
    ("encoding_format", {"model": MODEL_ID, "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ("dimensions", {"model": MODEL_ID, "input": "x", "dimensions": 64}, "dimensions"),
]


BAD_BODIES = ([(CHAT, *c) for c in BAD_CHAT] + [(COMPLETIONS, *c) for c in BAD_COMPLETIONS]
              + [(EMBEDDINGS, *c) for c in BAD_EMBEDDINGS])


@pytest.mark.parametrize("path,case,body,param", BAD_BODIES, ids=[f"{p.rsplit('/', 1)[-1]}: {c}" for p, c, _, _ in BAD_BODIES])
def test_bad_bodies_get_400_naming_the_field(server, api_key, path, case, body, param):
    status, doc, _ = post_raw(server, path, json.dumps(body).encode(), api_key[1])
    assert status == 400, doc
    assert_openai_error(doc, param)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, EMBEDDINGS])
def test_malformed_json_gets_400(server, api_key, path):
    status, doc, _ = post_raw(server, path, b'{"model": "x", "messages": [', api_key[1])
    assert status == 400
    assert_openai_error(doc, None)
    assert doc["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("path", [CHAT, EMBEDDINGS])
def test_deeply_nested_json_gets_400_not_500(server, api_key, path):
    # 100000 nested arrays made json.loads raise RecursionError: a 500 before.
    body = b'{"model": "' + MODEL_ID.encode() + b'", "messages": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    status, doc, _ = post_raw(server, path, body, api_key[1])
    assert status == 400, doc
    assert doc["error"]["code"] == "invalid_json" and "deeper" in doc["error"]["message"]


def test_json_schema_at_the_limits_still_works(client):
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 1000}}, "required": ["a"]}
    r = client.chat.completions.create(model=MODEL_ID, messages=MSGS, max_tokens=20, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": schema}})
    assert r.choices[0].message.content.startswith("{")


def test_non_object_json_gets_400(server, api_key):
    status, doc, _ = post_raw(server, CHAT, b"[1, 2]", api_key[1])
    assert status == 400 and doc["error"]["code"] == "invalid_json"


def test_unknown_model_gets_404_naming_model(server, api_key):
    status, doc, _ = post_raw(server, CHAT, json.dumps({"model": "gpt-17", "messages": MSGS}).encode(), api_key[1])
    assert status == 404
    assert_openai_error(doc, "model")
    assert doc["error"]["code"] == "model_not_found"
    assert MODEL_ID in doc["error"]["message"]


def test_prompt_longer_than_context_states_both_counts(server, api_key):
    long_prompt = "word " * 3000  # past the 2048-token context the test server runs with
    status, doc, _ = post_raw(server, COMPLETIONS, json.dumps({"model": MODEL_ID, "prompt": long_prompt}).encode(),
                              api_key[1])
    assert status == 400
    assert_openai_error(doc, "prompt")
    assert doc["error"]["code"] == "context_length_exceeded"
    assert "2048" in doc["error"]["message"] and "300" in doc["error"]["message"]


def test_max_tokens_past_the_context_is_served_until_the_context_ends(server, api_key):
    # An agent's max_tokens of 32000 is a ceiling (Claude Code sends it on every request): the answer ends where
    # the context does, with finish_reason "length", as llama-server's and Ollama's do. End-of-generation tokens
    # are banned so that it runs to the end.
    no_end = {str(t): -100 for t in (0, 2, 4)}  # SmolLM2's end-of-generation tokens
    body = {"model": MODEL_ID, "prompt": "word " * 2000, "max_tokens": 32000, "logit_bias": no_end,
            "temperature": 0}
    status, doc, _ = post_raw(server, COMPLETIONS, json.dumps(body).encode(), api_key[1])
    assert status == 200, doc
    assert doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"]["total_tokens"] == 2048 and doc["usage"]["completion_tokens"] < 100
    # Claude Code's request: a short prompt, max_tokens 32000, over the Messages API (a 400 before).
    body = {"model": MODEL_ID, "max_tokens": 32000, "messages": [{"role": "user", "content": "Say hi."}]}
    status, doc, _ = post_raw(server, "/v1/messages", json.dumps(body).encode(), api_key[1])
    assert status == 200 and doc["stop_reason"] in ("end_turn", "max_tokens"), doc


def test_streamed_request_refused_before_the_stream_starts(server, api_key):
    body = {"model": MODEL_ID, "prompt": "word " * 3000, "stream": True}
    status, doc, _ = post_raw(server, COMPLETIONS, json.dumps(body).encode(), api_key[1])
    assert status == 400 and doc["error"]["code"] == "context_length_exceeded"


def test_body_over_the_limit_gets_413(server, api_key):
    big = json.dumps({"model": MODEL_ID, "prompt": "x" * (2 << 20)}).encode()
    status, doc, _ = post_raw(server, COMPLETIONS, big, api_key[1])
    assert status == 413
    assert_openai_error(doc, None)


def test_unknown_route_and_method_are_openai_errors(server, api_key):
    status, doc, _ = post_raw(server, "/v1/nothing", b"{}", api_key[1])
    assert status == 404 and "error" in doc
    req = urllib.request.Request(server + "/v1/models", data=b"{}", method="DELETE",
                                 headers={"Authorization": f"Bearer {api_key[1]}"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 405 and "error" in json.loads(exc.value.read())


def test_missing_key_gets_401(server):
    status, doc, headers = post_raw(server, CHAT, json.dumps({"model": MODEL_ID, "messages": MSGS}).encode(), None)
    assert status == 401
    assert_openai_error(doc, None)
    assert headers["WWW-Authenticate"] == "Bearer"


def test_wrong_key_gets_401_through_the_openai_client(server):
    bad = openai.OpenAI(base_url=server + "/v1", api_key="ec-not-a-real-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.chat.completions.create(model=MODEL_ID, messages=MSGS, max_tokens=2)
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key"


def test_openai_client_sees_bad_request_error(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL_ID, messages=[], max_tokens=2)
    assert exc.value.body["param"] == "messages"


def test_server_still_serves_after_all_that(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=MSGS, max_tokens=3)
    assert r.choices[0].message.content
