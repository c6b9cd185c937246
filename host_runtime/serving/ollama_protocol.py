"""Ollama's API (pure): /api/chat, /api/generate and /api/embed bodies checked into the same engine calls the
OpenAI API makes, and the shapes of Ollama's answers (NDJSON lines, model listings), for the tools that speak only
Ollama (Open WebUI's model manager, Continue's `ollama` provider, Home Assistant's Ollama integration).

A body is mapped onto the chat/completions schema and checked by its rules (protocol.py), so the limits are the
same; a refusal names Ollama's field (`options.num_predict`, not `max_tokens`). Accepted and ignored, as they have
no meaning here: `options` other than those in OPTIONS (top_k, min_p, repeat_penalty, num_ctx, num_gpu, mirostat,
...), `template`, `context`, `truncate`, `images` (for a model served with a vision projector). /api/pull takes a GGUF's
location (an http(s) URL or hf://OWNER/REPO/FILE.gguf) as the model, as there is no registry; `insecure` is
ignored. `think`: a thinking model's
reasoning comes back apart as `thinking` (unless `think` is false, which also asks the template not to think;
"low"/"medium"/"high" reach templates that read a reasoning effort).
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import replace

from host_runtime.engine.media import image_format
from host_runtime.serving import protocol, request_models
from host_runtime.models.catalog import catalog_name, store_name
from host_runtime.serving.errors import APIError
from host_runtime.serving.protocol import GenerationCall, bad, field_of

VERSION = "0.6.3"  # what /api/version says: the Ollama API this follows (clients check for features by it)
TAG = ":latest"    # Ollama names carry a tag; ours have none: listed with ":latest", accepted with or without
NO_LIMIT = protocol.NO_LIMIT
# Ollama's option -> the OpenAI field it becomes; every other option is ignored.
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "num_predict": "max_tokens",
           "stop": "stop", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
# The OpenAI field a refusal names -> the Ollama field the client sent.
_PARAM_OF = {v: f"options.{k}" for k, v in OPTIONS.items()} | {"response_format": "format",
                                                                 "response_format.json_schema.schema": "format"}


def model_name(body: dict, served: str) -> str:
    """The model a body names, its tag dropped; the served one when it names none (Ollama requires a name: so do we
    where a client sends an empty one)."""
    name = field_of(body, "model", str)
    if not name:
        raise bad("'model' is required", "model", "missing_required_parameter")
    return store_name(name)  # qwen3:8b is the store's qwen3-8b (a catalog pull's name); tiny:latest is tiny


def loads_only(body: dict, kind: str) -> bool:
    """Ollama's load-or-unload idiom: a chat with no messages, a generate with no prompt (and no suffix)."""
    if kind == "chat":
        return not body.get("messages")
    return not body.get("prompt") and not body.get("suffix") and not body.get("images")


def load_answer(model: str, kind: str, reason: str) -> dict:
    """What Ollama answers to the idiom: done at once, done_reason "load" or "unload"."""
    doc = {"model": model, "created_at": now_iso()}
    doc.update({"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""})
    return {**doc, "done": True, "done_reason": reason}


def _renamed(err: APIError) -> APIError:
    param = _PARAM_OF.get(err.param or "", err.param)
    message = err.message
    if err.param in _PARAM_OF:
        message = message.replace(f"'{err.param}'", f"'{param}'")
    return APIError(err.status, message, param=param, code=err.code)


def _options(request: request_models.OllamaGeneration) -> dict:
    out: dict = {}
    if request.options is None:
        return out
    for name, target in OPTIONS.items():
        value = getattr(request.options, name)
        if value is None:
            continue
        if name == "num_predict":
            if value == 0:
                raise bad("'options.num_predict' must be a positive integer, -1 (no limit) or -2 (fill the "
                          "context)", "options.num_predict")
            if value < 0:
                continue  # no limit: as long as the context lasts
        out[target] = value
    return out


def _format(request: request_models.OllamaGeneration) -> dict | None:
    fmt = request.format
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}  # a JSON Schema object


def _with_images(content: str, images, where: str) -> str | list[dict]:
    """Ollama's `images` (base64, beside the text) as the chat API's parts: the images first, then the text, as
    Ollama's own templates lay them out. Each checked here, so errors name Ollama's field."""
    if not images:
        return content
    if not isinstance(images, list):
        raise bad(f"'{where}' must be an array of base64 images", where, "invalid_type")
    parts = []
    for j, image in enumerate(images):
        payload = protocol.image_payload(image, f"{where}[{j}]")
        kind = image_format(base64.b64decode(payload[:64])) or "png"
        parts.append({"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{payload}"}})
    return parts + [{"type": "text", "text": content}]


def _messages(body: dict) -> list[dict]:
    """Ollama's messages in the chat API's shape: tool calls' arguments are objects there, strings here."""
    out = []
    for i, m in enumerate(body["messages"]):  # a non-empty array of messages (request_models.OllamaChatRequest)
        text = m.get("content") if m.get("content") is not None else ""
        entry = {"role": m.get("role"), "content": _with_images(text, m.get("images"), f"messages[{i}].images")}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise bad(f"'messages[{i}].tool_calls' must be an array", f"messages[{i}].tool_calls", "invalid_type")
            entry["tool_calls"] = []
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad(f"'messages[{i}].tool_calls[{j}]' must be {{\"function\": {{\"name\", \"arguments\"}}}}",
                              f"messages[{i}].tool_calls[{j}]", "invalid_type")
                args = fn.get("arguments", {})
                entry["tool_calls"].append({"id": f"call_{i}_{j}", "type": "function", "function": {
                    "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
        if m.get("role") == "tool":
            # Ollama names the tool (tool_name) rather than the call; the template needs an id: the latest call's.
            entry["tool_call_id"] = _latest_call_id(out, m.get("tool_name"))
        out.append(entry)
    return out


def _latest_call_id(previous: list[dict], tool_name) -> str:
    for entry in reversed(previous):
        for call in reversed(entry.get("tool_calls") or []):
            if tool_name is None or call["function"]["name"] == tool_name:
                return call["id"]
    return "call_0"


def _common(request: request_models.OllamaGeneration) -> dict:
    """The OpenAI body's sampling fields, from Ollama's options, format and think (checked by its model)."""
    openai = {"stream": True if request.stream is None else request.stream, **_options(request)}  # Ollama streams
    fmt = _format(request)
    if fmt is not None:
        openai["response_format"] = fmt
    if request.think is False:
        openai["chat_template_kwargs"] = {"enable_thinking": False}
    elif isinstance(request.think, str):
        openai["reasoning_effort"] = request.think
    return openai


def _thinking(call: GenerationCall, request: request_models.OllamaGeneration) -> GenerationCall:
    """A thinking model's reasoning shown as Ollama's `thinking`, unless `think` is false."""
    return replace(call, show_reasoning=request.think is not False)


def parse_chat(body: dict, served: str, tool_format: str) -> GenerationCall:
    model_name(body, served)
    request = request_models.check(request_models.OllamaChatRequest, body)
    if not request.messages:
        raise bad("'messages' is required to generate (empty: the model is only loaded)", "messages",
                  "missing_required_parameter")
    openai = {"model": served, "messages": _messages(body), **_common(request)}
    if body.get("tools"):
        openai["tools"] = body["tools"]
        # EveryCycle's own field (Ollama has none): the chat API's tool_choice, to require a call.
        if body.get("tool_choice") is not None:
            openai["tool_choice"] = body["tool_choice"]
    try:
        return _thinking(protocol.parse_chat(openai, served, tool_format), request)
    except APIError as err:
        raise _renamed(err) from None


def parse_generate(body: dict, served: str, tool_format: str) -> GenerationCall:
    """/api/generate: a prompt with an optional system prompt, rendered by the chat template (Ollama's default);
    `raw: true` sends the prompt as it is."""
    model_name(body, served)
    request = request_models.check(request_models.OllamaGenerateRequest, body)
    prompt, suffix = request.prompt, request.suffix
    if prompt == "" and not suffix:
        raise bad("'prompt' is required", "prompt", "missing_required_parameter")
    common = _common(request)
    if body.get("images") and (suffix or request.raw):
        raise bad("'images' go with a chat-templated prompt, not with 'raw' or 'suffix'", "images")
    try:
        if suffix:  # fill in the middle (Continue's autocomplete): the model's FIM tokens around the two texts
            return protocol.parse_completion({"model": served, "prompt": prompt, "suffix": suffix,
                                              "max_tokens": NO_LIMIT, **common}, served)
        if request.raw:
            # No num_predict: no limit (Ollama's default), which the engine ends where the context does.
            return protocol.parse_completion({"model": served, "prompt": prompt, "max_tokens": NO_LIMIT, **common},
                                             served)
        system = request.system
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": _with_images(prompt, body.get("images"), "images")}]
        return _thinking(protocol.parse_chat({"model": served, "messages": messages, **common}, served, tool_format),
                         request)
    except APIError as err:
        raise _renamed(err) from None


def parse_embed(body: dict, served: str) -> protocol.EmbeddingCall:
    model_name(body, served)
    request_models.check(request_models.OllamaEmbedRequest if "input" in body else request_models.OllamaEmbeddingsRequest,
                         body)
    data = body.get("input") if "input" in body else body.get("prompt")  # /api/embeddings (legacy) sends prompt
    return protocol.parse_embeddings({"model": served, "input": data}, served)


PULL_SCHEMES = ("http://", "https://", "hf://")


def parse_pull(body: dict) -> tuple[str, bool]:
    """(source, stream) of a /api/pull body. There is no Ollama registry here: the model is named by where its GGUF
    is, an http(s) URL (on the LAN) or hf://OWNER/REPO/FILE.gguf; `insecure` is accepted and ignored."""
    request = request_models.check(request_models.OllamaPullRequest, body)
    source = request.model or request.name  # older clients send `name`
    if not source:
        raise bad("'model' is required: where the GGUF is (an http(s) URL, or hf://OWNER/REPO/FILE.gguf)", "model",
                  "missing_required_parameter")
    if "://" in source and not source.startswith(PULL_SCHEMES):
        raise bad(f"'model' {source!r} is not a source this box pulls from: give a name in the box's catalog "
                  "(qwen3:8b), an http(s) URL or hf://OWNER/REPO:QUANT", "model")
    return source, True if request.stream is None else request.stream


# ---- answers ---------------------------------------------------------------------------------------------------

def now_iso() -> str:
    return iso_at(time.time())


def iso_at(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1e6):06d}Z"


FOREVER_S = 100 * 365 * 86400  # a model that stays: Ollama says keep_alive -1 so, an expiry far off


def expires_at(expires_in_s: float | None) -> str:
    """/api/ps's expires_at: when the keep-alive unloads the model (far off where it stays)."""
    return iso_at(time.time() + (FOREVER_S if expires_in_s is None else expires_in_s))


def listed_name(model_id: str) -> str:
    """How Ollama's clients see a model: a catalog pull by the name it was pulled by (qwen3:8b), any other with
    ":latest" (model_name reads either back as the store's name)."""
    return catalog_name(model_id) or model_id + TAG


def details(info: dict | None) -> dict:
    """A model's `details` as Ollama lists them (from the store's manifest, where it has one)."""
    info = info or {}
    arch = info.get("architecture") or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": info.get("parameter_size") or "", "quantization_level": info.get("quantization") or ""}


def final_line(model: str, started_ns: int, prompt_tokens: int, completion_tokens: int, done_reason: str,
               **extra) -> dict:
    total = time.monotonic_ns() - started_ns
    return {"model": model, "created_at": now_iso(), **extra, "done": True, "done_reason": done_reason,
            "total_duration": total, "load_duration": 0, "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": 0, "eval_count": completion_tokens, "eval_duration": total}


def done_reason(finish: str | None) -> str:
    return {"length": "length", "tool_calls": "stop"}.get(finish or "stop", "stop")


def tool_calls(calls) -> list[dict]:
    """Our tool calls as Ollama gives them: arguments as an object, no ids needed."""
    return [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def ndjson(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"

