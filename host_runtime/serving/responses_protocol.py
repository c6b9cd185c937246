"""OpenAI's Responses API (pure), stateless (`store: false` semantics): a /v1/responses body checked into the same
engine call chat completions make, and the Response object and output items the answer is shaped into. Codex CLI
and the OpenAI Agents SDK speak only this API.

Input: a string, or items: messages (roles system, developer, user, assistant; content as a string or
input_text/output_text parts, and input_image parts as data: URIs), `function_call` and `function_call_output`
(the agent loop's own items), reasoning items (dropped: the model did not write them here). `instructions` is the system message. Function tools only;
`text.format` (json_object, json_schema) is response_format's grammar; `max_output_tokens` is a ceiling, as
max_tokens. `previous_response_id` is refused (nothing is stored); `reasoning`, `store`, `metadata`, `user`,
`truncation`, `include`, `service_tier`, `prompt_cache_key` and `safety_identifier` are accepted and change nothing.
"""

from __future__ import annotations

import secrets
import time

from host_runtime.serving import protocol, request_models
from host_runtime.serving.errors import APIError
from host_runtime.serving.protocol import GenerationCall, bad

# The chat field a refusal names -> the Responses field the client sent.
_PARAM_OF = {"max_tokens": "max_output_tokens", "response_format": "text.format",
             "response_format.json_schema.schema": "text.format.schema", "messages": "input"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _renamed(err: APIError) -> APIError:
    param = err.param or ""
    for chat, ours in _PARAM_OF.items():
        if param == chat or param.startswith(chat + "[") or param.startswith(chat + "."):
            new = ours + param[len(chat):]
            return APIError(err.status, err.message.replace(f"'{param}", f"'{new}"), param=new, code=err.code)
    return err


def _text(content, where: str) -> str:
    """A message's content: a string, or text parts (input_text, output_text, text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{where}' must be a string or an array of content parts", where, "invalid_type")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise bad(f"'{where}[{j}]' is an {kind} part: only a message's content takes images", f"{where}[{j}]",
                      "unsupported_value")
        else:
            raise bad(f"'{where}[{j}]' must be an input_text or output_text part", f"{where}[{j}]", "invalid_type")
    return "".join(out)


def _content(content, where: str) -> str | list[dict]:
    """A message's content: its text, or, where it holds input_image parts (an image_url that is a data: URI),
    the chat API's text and image_url parts, each image checked here so that errors name this API's field."""
    if not isinstance(content, list) or not any(isinstance(part, dict) and part.get("type") == "input_image"
                                                for part in content):
        return _text(content, where)
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            at = f"{where}[{j}].image_url"
            if part.get("image_url") is None:
                raise bad(f"'{at}' is required: the image as a data: URI (a file_id is not kept here)", at,
                          "missing_required_parameter")
            protocol.image_url_payload(part["image_url"], at)
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            parts.append({"type": "text", "text": _text([part], where)})
    return parts


def _messages(request: request_models.ResponsesRequest) -> list[dict]:
    out: list[dict] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    items = request.input  # a string or a non-empty array of objects, each read below by its kind
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise bad(f"'{where}.role' must be system, developer, user or assistant, got {role!r}",
                          f"{where}.role")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise bad(f"'{where}' must have string 'call_id', 'name' and 'arguments'", where, "invalid_type")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or output is None:
                raise bad(f"'{where}' must have a string 'call_id' and an 'output'", where, "invalid_type")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _text(output, f"{where}.output")})
        elif kind == "reasoning":
            continue  # another model's thinking: not this one's to read
        else:
            raise bad(f"'{where}.type' {kind!r} is not supported (message, function_call, function_call_output)",
                      f"{where}.type", "unsupported_value")
    return out


# OpenAI's hosted tools: they run on OpenAI's servers, not in the model's answer. A box runs none of them, so a
# client that always offers one (Codex CLI offers web_search) is served without it.
HOSTED_TOOLS = frozenset({"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                          "computer_use_preview", "mcp", "local_shell"})


def _function_tools(tools: list, where: str) -> list[dict]:
    """The function tools offered: a namespace's own functions among them (Codex CLI groups its sub-agent tools in
    one), hosted tools left out; any other kind is refused naming it."""
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        kind = kind if isinstance(kind, str) else None  # (not a name: refused below, as a missing one)
        if kind == "function":
            out.append(tool)
        elif kind == "namespace" and isinstance(tool.get("tools"), list):
            out += _function_tools(tool["tools"], f"{where}[{i}].tools")
        elif kind not in HOSTED_TOOLS:
            raise bad(f"'{where}[{i}].type' {kind!r}: only function tools (and namespaces of them) are supported here; "
                      f"hosted tools ({', '.join(sorted(HOSTED_TOOLS))}) are left out", f"{where}[{i}].type",
                      "unsupported_value")
    return out


def _tools(request: request_models.ResponsesRequest) -> dict:
    out: dict = {}
    if request.tools is not None:
        offered = [tool.model_dump(exclude_none=True) for tool in request.tools]  # as checked, extras kept
        out["tools"] = [{"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                                           if k in tool}}
                        for tool in _function_tools(offered, "tools")]
    choice = request.tool_choice
    if isinstance(choice, request_models.ResponsesNamedTool):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        out["tool_choice"] = choice
    if request.parallel_tool_calls is not None:
        out["parallel_tool_calls"] = request.parallel_tool_calls
    return out


def _format(request: request_models.ResponsesRequest) -> dict:
    fmt = request.text.format if request.text is not None else None
    if fmt is None:
        return {}
    if fmt.type == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": fmt.name or "format",
                                                                           "schema": fmt.schema_}}}
    return {"response_format": {"type": fmt.type}}


def parse_responses(body: dict, served: str, tool_format: str) -> GenerationCall:
    protocol.check_model(body, served)
    request = request_models.check(request_models.ResponsesRequest, body)
    if (request.model_extra or {}).get("previous_response_id") is not None:
        raise bad("'previous_response_id': this server stores no responses; send the whole conversation in 'input'",
                  "previous_response_id", "unsupported_parameter")
    # The chat API's request, made from the checked one: the chat parser derives the engine's call from it.
    chat = {"model": served, "messages": _messages(request), "stream": bool(request.stream), **_tools(request),
            **_format(request)}
    if request.temperature is not None:
        chat["temperature"] = request.temperature
    if request.top_p is not None:
        chat["top_p"] = request.top_p
    if request.max_output_tokens is not None:
        chat["max_tokens"] = request.max_output_tokens
    effort = request.reasoning.effort if request.reasoning is not None else None
    if effort is not None:
        chat["reasoning_effort"] = effort  # for templates that read it (gpt-oss)
    try:
        return protocol.parse_chat(chat, served, tool_format)
    except APIError as err:
        raise _renamed(err) from None


# ---- answers ---------------------------------------------------------------------------------------------------

def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [output_text(text)] if status == "completed" else []}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    """A thinking model's reasoning, as the Responses API's reasoning item (its text in `content`)."""
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(call, item_id: str | None = None, status: str = "completed", arguments: str | None = None) -> dict:
    """A tool_calls.ToolCall as a function_call output item."""
    args = call.wire()["function"]["arguments"] if arguments is None else arguments
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call.id, "name": call.name,
            "arguments": args, "status": status}


def response(body: dict, model: str, response_id: str, created: int, output: list[dict], status: str,
             usage: dict | None, incomplete: str | None = None) -> dict:
    """The Response object (status in_progress while streaming, then completed or incomplete)."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}}
    return {"id": response_id, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "usage": usage, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": body.get("instructions"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": False, "text": text,
            "truncation": "disabled", "metadata": body.get("metadata") or {}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


def now() -> int:
    return int(time.time())
