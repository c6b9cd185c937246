"""The Anthropic Messages API's wire schema (pure): requests checked field by field into the same engine call
the chat API makes, answers and stream events shaped as the Messages API sends them, and its error body.

Content blocks taken: text, tool_use (assistant) and tool_result (user); a system prompt as text or text
blocks; tools with input_schema and tool_choice auto/any/tool/none. Images and documents are refused clearly.
"""

from __future__ import annotations

import json
import secrets

from host_runtime.engine import wire as engine_wire
from host_runtime.serving import protocol, request_models
from host_runtime.serving.errors import APIError
from host_runtime.serving.protocol import GenerationCall, bad, check_model
from host_runtime.serving.request_models import check
from host_runtime.serving.tool_calls import ToolCall, grammar_for, parse_tool_choice, parse_tools

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text_of(value, where: str) -> str:
    return protocol.joined_text(value, where, "block")


def _messages(body: dict, images: list[str]) -> list[dict]:
    """The conversation in the chat API's shape (tool_use -> tool_calls, tool_result -> tool messages); image
    blocks' images appended to `images`, wire.MEDIA_MARKER standing for each in the text."""
    out: list[dict] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty array of messages", "messages", "invalid_type")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad(f"'{where}' must be an object with 'role' and 'content'", where, "invalid_type")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"'{where}.role' must be 'user' or 'assistant', got {role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"'{where}.content' must be a string or an array of content blocks", f"{where}.content",
                      "invalid_type")
        text, calls, results = [], [], []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                text.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                        or not isinstance(block.get("input"), dict):
                    raise bad(f"'{at}' must have a string 'id' and 'name' and an object 'input'", at, "invalid_type")
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
            elif kind == "tool_result" and role == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise bad(f"'{at}.tool_use_id' is required", f"{at}.tool_use_id", "missing_required_parameter")
                result = _text_of(block.get("content", ""), f"{at}.content")
                if block.get("is_error"):
                    result = f"Error: {result}"
                results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
            elif kind == "image":
                images.append(_image_block(block, at))
                text.append(engine_wire.MEDIA_MARKER)
            elif kind == "document":
                raise bad(f"'{at}' is a document block: this box reads text and images", at, "unsupported_value")
            else:
                raise bad(f"'{at}' must be a text block" + (", a tool_use block" if role == "assistant" else
                                                            ", or a tool_result block"), at, "invalid_type")
        out += results  # tool results answer the previous turn's calls, before the user's new text
        if text or calls or not results:
            entry = {"role": role, "content": "".join(text)}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
    return out


def _image_block(block: dict, at: str) -> str:
    """An image block's base64 image ({"type": "base64", "media_type": ..., "data": ...}); a URL source is refused:
    the box fetches nothing a client names."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise bad(f"'{at}.source' is required", f"{at}.source", "missing_required_parameter")
    if source.get("type") == "url":
        raise bad(f"'{at}.source': remote image URLs are not fetched; send the image as base64", f"{at}.source",
                  "unsupported_image_url")
    if source.get("type") != "base64":
        raise bad(f"'{at}.source.type' must be 'base64'", f"{at}.source.type")
    return protocol.image_payload(source.get("data"), f"{at}.source.data")


def _tools(request: request_models.CountTokensRequest) -> tuple[list, object]:
    """Anthropic tools and tool_choice, checked by the chat API's rules (errors name the Anthropic fields)."""
    wire = [{"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                               "parameters": tool.input_schema if tool.input_schema is not None
                                               else {"type": "object", "properties": {}}}}
            for tool in request.tools or []]
    choice = request.tool_choice or request_models.AnthropicToolChoice(type="auto")
    openai_choice = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
        {"type": "function", "function": {"name": choice.name}}
    try:
        parsed = parse_tools({"tools": wire})
        return parsed, parse_tool_choice({"tool_choice": openai_choice if wire or choice.type == "none" else None,
                                          "parallel_tool_calls": not choice.disable_parallel_tool_use}, parsed)
    except APIError as err:
        param = (err.param or "").replace(".function.parameters", ".input_schema").replace(".function.name", ".name")
        message = err.message.replace(".function.parameters", ".input_schema").replace(".function.name", ".name")
        raise APIError(err.status, message, param=param, code=err.code) from None


def _output_format_grammar(request: request_models.MessagesRequest) -> str | None:
    """Structured outputs (`output_config.format`, a JSON Schema): the chat API's response_format grammar."""
    fmt = request.output_config.format if request.output_config is not None else None
    if fmt is None:
        return None
    return protocol.json_schema_grammar(fmt.schema_, "output_config.format.schema")


# The Messages API's own defaults, where a request leaves them out (or null)
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


def parse_messages(body: dict, served_model: str, tool_format: str = "generic") -> GenerationCall:
    check_model(body, served_model)
    request = check(request_models.MessagesRequest, body)
    stops = request.stop_sequences or []
    if (request.model_extra or {}).get("top_k") is not None:
        raise bad("'top_k' is not supported by this server; use 'temperature' or 'top_p'", "top_k",
                  "unsupported_parameter")
    # A thinking model's reasoning comes back as thinking blocks when asked for; otherwise it is left out.
    show_thinking = request.thinking is not None and request.thinking.type != "disabled"
    images: list[str] = []
    messages = _messages(body, images)
    tools, choice = _tools(request)
    grammar = grammar_for(tool_format, tools, choice) if choice.constrained else None
    structured = _output_format_grammar(request)
    if structured is not None:
        if grammar is not None:
            raise bad("'output_config.format' and a forced tool use cannot both constrain the answer",
                      "output_config.format")
        grammar = structured
    sampling = engine_wire.SamplingParams(
        temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
        top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p, grammar=grammar)
    offered = tools if choice.mode != "none" else []
    generate = engine_wire.Generate(_prompt(messages, offered, choice, images), request.max_tokens, 1, list(stops),
                                    sampling)
    return GenerationCall(generate, bool(request.stream), False, False, tools=offered, tool_choice=choice,
                          stop_sequences=list(stops), show_reasoning=show_thinking)


def _prompt(messages: list[dict], offered: list, choice, images: list[str]) -> engine_wire.ChatPrompt:
    return engine_wire.ChatPrompt(messages, [t.wire() for t in offered] or None, choice.parallel, media=images or None)


def parse_count_tokens(body: dict, served_model: str) -> engine_wire.CountTokens:
    check_model(body, served_model)
    request = check(request_models.CountTokensRequest, body)
    tools, choice = _tools(request)
    images: list[str] = []
    messages = _messages(body, images)
    return engine_wire.CountTokens(_prompt(messages, tools if choice.mode != "none" else [], choice, images))


# ---- answers ---------------------------------------------------------------------------------------------------

def message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def tool_use_block(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": call.arguments}


def stop_of(finish: str | None, stop_string: str | None, call: GenerationCall, has_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): only the caller's own stop_sequences are reported as such."""
    if has_calls and finish == "stop":
        return "tool_use", None
    if finish == "stop" and stop_string is not None and stop_string in call.stop_sequences:
        return "stop_sequence", stop_string
    return STOP_REASONS.get(finish or "stop", "end_turn"), None


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    # The prefix cache's hits are what Anthropic calls cache reads; input_tokens counts the rest.
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
