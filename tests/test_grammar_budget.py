"""Grammar work bounded before any conversion (pure): the tool-grammar attack of the third hardening review, the
budget shared by a request's schemas, the caps on the grammars made, and the IPC line's bound."""

import json
import socket
import time

import pytest

from host_runtime.engine import wire
from host_runtime.engine.client import EngineClient
from host_runtime.engine.ipc import MAX_REQUEST_LINE_BYTES, LineReader, MessageTooLarge
from host_runtime.serving import tool_calls
from host_runtime.serving.anthropic_protocol import parse_messages
from host_runtime.serving.errors import APIError
from host_runtime.serving.grammar_budget import (MAX_REQUEST_WEIGHT, MAX_TOOLS_GRAMMAR_BYTES, pattern_weight,
                                                 schema_weight)
from host_runtime.serving.handlers import engine_down
from host_runtime.serving.protocol import parse_chat

MODEL = "m"
MSGS = [{"role": "user", "content": "hi"}]


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _pattern_tool(name: str, pattern: str) -> dict:
    return _tool(name, {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}})


# The review's request: 18 KB of `(a){1000}` sent a 53 MiB grammar to the engine (224 MiB in the worker, 3.8 s).
ATTACK_PATTERN = "^" + "(a){1000}" * 450 + "$"  # 4052 characters, under the pattern length limit


def _refused(call, *args) -> APIError:
    started = time.perf_counter()
    with pytest.raises(APIError) as err:
        call(*args)
    # Refused by weighing, before any conversion: milliseconds, not the seconds converting took.
    assert time.perf_counter() - started < 0.5
    assert err.value.status == 400 and "Traceback" not in err.value.message
    return err.value


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_the_reviews_repeated_pattern_is_refused_before_any_grammar_is_made(choice, monkeypatch):
    converted = []
    real = tool_calls.schema_grammar
    monkeypatch.setattr(tool_calls, "schema_grammar", lambda schema: converted.append(1) or real(schema))
    body = {"model": MODEL, "messages": MSGS, "tools": [_pattern_tool("f", ATTACK_PATTERN)], "tool_choice": choice}
    err = _refused(parse_chat, body, MODEL)
    assert err.param == "tools[0].function.parameters" and "grammar of about" in err.message
    assert converted == []


def test_the_same_tools_through_the_messages_api_are_refused_naming_the_anthropic_field():
    body = {"model": MODEL, "max_tokens": 10, "messages": MSGS, "tool_choice": {"type": "any"},
            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {
                "x": {"type": "string", "pattern": ATTACK_PATTERN}}}}]}
    err = _refused(parse_messages, body, MODEL)
    assert err.param == "tools[0].input_schema"


def test_many_small_tools_share_one_budget():
    # Each tool alone passes; together they would make megabytes of grammar.
    one = "^" + "(a){1000}" * 5 + "$"
    assert schema_weight({"type": "string", "pattern": one}, "x") < MAX_REQUEST_WEIGHT
    parse_chat({"model": MODEL, "messages": MSGS, "tools": [_pattern_tool("f0", "^(a){1000}$")]}, MODEL)
    body = {"model": MODEL, "messages": MSGS, "tool_choice": "required",
            "tools": [_pattern_tool(f"f{i}", one) for i in range(100)]}
    err = _refused(parse_chat, body, MODEL)
    assert err.param.startswith("tools[") and err.param.endswith("].function.parameters")


def test_a_response_format_pattern_is_weighed_too():
    body = {"model": MODEL, "messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": ATTACK_PATTERN}}}}
    err = _refused(parse_chat, body, MODEL)
    assert err.param == "response_format.json_schema.schema"


def test_a_pattern_past_its_length_or_repetition_limit_is_named():
    err = _refused(parse_chat, {"model": MODEL, "messages": MSGS,
                                "tools": [_pattern_tool("f", "^" + "a" * 5000 + "$")]}, MODEL)
    assert err.param == "tools[0].function.parameters.pattern" and "characters long" in err.message
    err = _refused(parse_chat, {"model": MODEL, "messages": MSGS,
                                "tools": [_pattern_tool("f", "^[a-z]{2,5000}$")]}, MODEL)
    assert err.param == "tools[0].function.parameters.pattern" and "5000" in err.message


def test_the_tools_grammar_is_capped_by_its_real_size():
    # Fifteen tools each with a long array: under the estimate's budget, over the grammar cap together, so a
    # required call is refused; offered with `auto` (each tool's own grammar under the cap) they are served.
    listy = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"},
                                                        "minItems": 1, "maxItems": 1000}}}
    tools = [_tool(f"list_{i}", listy) for i in range(15)]
    call = parse_chat({"model": MODEL, "messages": MSGS, "tools": tools}, MODEL)
    assert call.request.sampling.grammar is None
    err = _refused(parse_chat, {"model": MODEL, "messages": MSGS, "tools": tools, "tool_choice": "required"}, MODEL)
    assert err.param == "tools" and f"the limit is {MAX_TOOLS_GRAMMAR_BYTES}" in err.message


AGENT_TOOLS = {
    "bash": {"command": {"type": "string"}, "timeout": {"type": "number"}, "description": {"type": "string"}},
    "read": {"filePath": {"type": "string"}, "offset": {"type": "number"}, "limit": {"type": "number"}},
    "edit": {"filePath": {"type": "string"}, "oldString": {"type": "string"}, "newString": {"type": "string"},
             "replaceAll": {"type": "boolean"}},
    "glob": {"pattern": {"type": "string"}, "path": {"type": "string"}},
    "todowrite": {"todos": {"type": "array", "items": {"type": "object", "properties": {
        "content": {"type": "string"}, "status": {"enum": ["pending", "in_progress", "completed"]},
        "id": {"type": "string"}}, "required": ["content", "status", "id"]}}},
    "webfetch": {"url": {"type": "string", "format": "uri"}, "format": {"enum": ["text", "markdown", "html"]}},
    "search": {"query": {"type": "string", "minLength": 1, "maxLength": 500},
               "limit": {"type": "integer", "minimum": 1, "maximum": 50},
               "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
}


def test_an_agents_tools_are_well_inside_the_bounds():
    tools = [_tool(name, {"type": "object", "properties": props, "required": list(props)[:1]})
             for name, props in AGENT_TOOLS.items()]
    call = parse_chat({"model": MODEL, "messages": MSGS, "tools": tools, "tool_choice": "required"}, MODEL)
    grammar = call.request.sampling.grammar
    assert grammar and len(grammar) < MAX_TOOLS_GRAMMAR_BYTES // 8


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^" + "(a){1000}" * 20 + "$"},
    {"type": "string", "pattern": "^((ab|cd){30}){30}$"},
    {"type": "string", "pattern": "^[a-zA-Z0-9_]{1,1000}(x|y){0,1000}$"},
    {"type": "string", "maxLength": 1000},
    {"type": "object", "properties": {"a" * 60: {"type": "object", "properties": {"b" * 60: {
        "type": "array", "items": {"type": "object", "properties": {"c": {"type": "string"}}}, "maxItems": 1000}}}}},
    {"type": "object", "properties": {f"p{i}": {"type": "array", "items": {"type": "string"}, "maxItems": 900}
                                      for i in range(8)}},
    {"type": "object", "properties": {"x": {"enum": ["v" * 200] * 100}}},
], ids=["groups", "nested", "class", "maxLength", "deep-array", "arrays", "enum"])
def test_the_weight_bounds_what_the_converter_writes(schema):
    """The budget is only a bound if the estimate grows as the grammar does: within a small factor of the real
    size for every shape that repeats (the converter's fixed rules, a few hundred bytes, aside)."""
    real = len(tool_calls.schema_grammar(schema))
    weight = schema_weight(schema, "x")
    assert real <= 3 * weight + 2048, (real, weight)


def test_pattern_weight_counts_what_each_repetition_writes():
    assert pattern_weight("abc", 10, "x") == 3
    assert pattern_weight("(a){1000}", 10, "x") > 10_000      # a thousand references to the group's rule
    assert pattern_weight("[abcdef]{100}", 10, "x") > 800     # the class written out a hundred times
    assert pattern_weight(r"\d{3}-\d{4}", 10, "x") < 60
    assert pattern_weight("a{2,}", 10, "x") < 30
    with pytest.raises(APIError):
        pattern_weight("(a){1001}", 10, "x")


def test_an_engine_call_past_the_line_limit_is_a_413_and_is_never_sent(tmp_path):
    path = tmp_path / "engine.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(0.2)
    try:
        with pytest.raises(MessageTooLarge) as err:
            EngineClient(str(path)).generate(wire.Generate(wire.TextPrompt("x" * MAX_REQUEST_LINE_BYTES)), 1, 1)
        with pytest.raises(socket.timeout):
            listener.accept()  # refused before connecting
    finally:
        listener.close()
    api = engine_down(err.value)
    assert api.status == 413 and api.code == "request_too_large"


@pytest.mark.parametrize("pad,fits", [(2000, False), (900, True)])
def test_the_engine_reads_at_most_its_line_limit(pad, fits):
    a, b = socket.socketpair()
    try:
        a.sendall(json.dumps({"op": "info", "pad": "x" * pad}).encode() + b"\n")
        if fits:
            assert LineReader(b, limit=1000).read()["op"] == "info"
        else:
            with pytest.raises(MessageTooLarge):
                LineReader(b, limit=1000).read()
    finally:
        a.close()
        b.close()
