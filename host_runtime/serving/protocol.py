"""The wire schema (pure): OpenAI request bodies checked field by field into engine calls.

Every refusal names the field (`param`) and what was expected.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field, replace

from host_runtime.engine import wire
from host_runtime.engine.media import MAX_IMAGE_PIXELS, audio_format, image_format, image_size
from host_runtime.serving import request_models
from host_runtime.serving.errors import APIError
from host_runtime.serving.grammar_budget import MAX_SCHEMA_GRAMMAR_BYTES, GrammarBudget, check_grammar_size
from host_runtime.serving.json_schema_grammar import json_object_grammar, schema_grammar
from host_runtime.engine.reasoning import split
from host_runtime.serving.request_models import KINDS, check
from host_runtime.serving.tool_calls import ToolCallStream, grammar_for, parse_output, parse_tool_choice, parse_tools

# JSON bodies nest at most this deep: Python's parser would otherwise recurse until RecursionError.
MAX_JSON_DEPTH = 64
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}
UNSUPPORTED_ROLES = {"function"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


NO_LIMIT = 1 << 30  # max_tokens for "no limit" (Ollama's, llama-server's): the engine ends where the context does


def bad(message: str, param: str, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def field_of(body: dict, name: str, types, default=None):
    """body[name] if present and of `types` (bool is never an int here), else the default: for the fields read
    before a body's model checks it (the model's name, which decides 404 before any 400)."""
    if name not in body or body[name] is None:
        return default
    value = body[name]
    types_t = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types_t:
        ok = False
    elif float in types_t and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    else:
        ok = isinstance(value, types_t)
    if not ok:
        words = " or ".join(KINDS.get(t, t.__name__) for t in types_t)
        raise bad(f"'{name}' must be {words}, got {type(value).__name__}", name, "invalid_type")
    return value


def json_depth_exceeds(raw: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays/objects deeper than `limit`, without parsing it (strings skipped)."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def parse_json_body(raw: bytes) -> dict:
    if json_depth_exceeds(raw, MAX_JSON_DEPTH):
        raise APIError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def check_model(body: dict, served: str) -> str:
    model = field_of(body, "model", str)
    if model is None:
        raise bad("'model' is required", "model", "missing_required_parameter")
    if model != served:
        raise APIError(404, f"the model '{model}' does not exist; this box serves '{served}'", param="model",
                       code="model_not_found")
    return model


@dataclass
class GenerationCall:
    """What the serving logic needs: the engine's request plus how to shape the answer."""
    request: wire.Generate
    stream: bool
    include_usage: bool
    logprobs: bool
    tools: list = field(default_factory=list)  # tool_calls.Tool offered to the model (read back from its answer)
    tool_choice: object = None                 # tool_calls.ToolChoice, where tools may be offered
    stop_sequences: list[str] = field(default_factory=list)  # the caller's own (Anthropic reports them)
    reasoning: bool = True  # a thinking model's reasoning apart from its answer (reasoning_format not "none")
    show_reasoning: bool = True  # whether the answer carries it (the Messages API: only when thinking was asked for)
    trace: object = field(default=None, compare=False)  # serving/tracing.RequestTrace, where requests are traced

    @property
    def n(self) -> int:
        return self.request.n

    def thinking(self, mode: str) -> str:
        """How this call's answers start (reasoning.MODES), given what the engine said of the prompt."""
        return mode if self.reasoning else ""

    def answer_parts(self, text: str, finish: str | None, mode: str) -> tuple[str | None, str | None, list]:
        """A whole answer's (reasoning or None, content, tool calls): the reasoning apart first (the engine's
        `mode` for the prompt), then the calls read from what follows it."""
        reasoning, text = split(text, self.thinking(mode))
        content, calls = self.answer_calls(text, finish)
        return reasoning, content, calls

    def answer_calls(self, text: str, finish: str | None) -> tuple[str | None, list]:
        """A whole answer's (content, tool calls): none without tools offered, the first alone unless parallel calls
        are allowed, and the whole text as content when no call parses (every API shapes these its own way)."""
        if not self.tools:
            return text, []
        content, calls = parse_output(text, self.tools, truncated=finish == "length")
        calls = calls if self.tool_choice.parallel else calls[:1]
        return (content, calls) if calls else (text, [])

    def call_stream(self) -> ToolCallStream | None:
        """What holds back a streamed answer's possible calls, with tools offered (its finish() applies the same
        rules as answer_calls)."""
        return ToolCallStream(self.tools, self.tool_choice.parallel) if self.tools else None

    def scoped(self, cache_scope: str | None, priority: str = "default", key: str | None = None,
               key_max_concurrent: int = 0, key_tokens_per_minute: int = 0,
               key_tokens_per_day: int = 0) -> "GenerationCall":
        """The same call with what the serving API sets from the request's key: its prefix-cache scope, its
        priority class, and its name and limit (the engine counts the key's requests)."""
        return replace(self, request=replace(self.request, cache_scope=cache_scope, priority=priority, key=key,
                                             key_max_concurrent=key_max_concurrent,
                                             key_tokens_per_minute=key_tokens_per_minute,
                                             key_tokens_per_day=key_tokens_per_day))


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    return [] if stop is None else [stop] if isinstance(stop, str) else list(stop)


def _logit_bias(bias: dict[str, float] | None) -> dict[str, float] | None:
    return {str(int(token)): float(value) for token, value in bias.items()} if bias else None


def _response_format_grammar(fmt: request_models.ResponseFormat | None) -> str | None:
    if fmt is None or fmt.type in (None, "text"):
        return None
    if fmt.type == "json_object":
        return json_object_grammar()
    return json_schema_grammar(fmt.json_schema.schema_ if fmt.json_schema is not None else None,
                               "response_format.json_schema.schema")


def json_schema_grammar(schema: dict | None, where: str) -> str:
    """A JSON Schema's grammar, its cost bounded before the conversion; the API's 400 naming `where` otherwise."""
    if not isinstance(schema, dict):
        raise bad(f"'{where}' must be a JSON Schema object", where, "invalid_type")
    GrammarBudget().charge(schema, where)  # before converting: the converter's work is bounded too
    try:
        grammar = schema_grammar(schema)
    except Exception as exc:  # the converter raises bare Exceptions (and KeyErrors) for what it cannot do
        raise bad(f"this JSON Schema cannot be turned into a grammar: {type(exc).__name__}: {exc}", where) from None
    return check_grammar_size(grammar, MAX_SCHEMA_GRAMMAR_BYTES, where, "this JSON Schema")


@dataclass(frozen=True)
class _Common:
    """The fields chat and completions share, checked."""
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    stop: list[str]
    speculation: bool
    sampling: dict  # wire.SamplingParams' fields, completed per API


def _sampling_and_common(req: request_models.Sampling, default_max_tokens: int | None) -> _Common:
    """The fields chat and completions share, from the checked request. A sampling value the client left out is
    left out here too: wire.SamplingParams holds the one default of each."""
    max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
    stream = bool(req.stream)
    if req.stream_options is not None and not stream:
        raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    given_values = {"temperature": req.temperature, "top_p": req.top_p, "presence_penalty": req.presence_penalty,
                    "frequency_penalty": req.frequency_penalty}
    sampling = {name: float(value) for name, value in given_values.items() if value is not None}
    sampling.update(seed=req.seed, grammar=_response_format_grammar(req.response_format),
                    logit_bias=_logit_bias(req.logit_bias))
    # EveryCycle's own field `speculation`: false opts this request out of speculative decoding (the output is
    # the same either way; a client measuring the model's own speed may want it off).
    include_usage = bool(req.stream_options is not None and req.stream_options.include_usage)
    return _Common(max_tokens, req.n or 1, stream, include_usage, _stop_strings(req.stop), req.speculation is not False,
                   sampling)


def _generate(common: _Common, prompt, **sampling) -> wire.Generate:
    return wire.Generate(prompt, common.max_tokens, common.n, common.stop,
                         wire.SamplingParams(**{**common.sampling, **sampling}), common.speculation)


def joined_text(content, where: str, part: str = "part") -> str:
    """A string, or an array of text parts ({"type": "text", "text": ...}; Anthropic calls them blocks) joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, item in enumerate(content):
            if not isinstance(item, dict) or item.get("type") != "text" or not isinstance(item.get("text"), str):
                raise bad(f"'{where}[{j}]' must be a text {part} ({{\"type\": \"text\", \"text\": ...}}); "
                          "this model reads text only", f"{where}[{j}]")
            texts.append(item["text"])
        return "".join(texts)
    raise bad(f"'{where}' must be a string or an array of text {part}s", where, "invalid_type")


def _message_content(message: dict, i: int, images: list[str] | None) -> str:
    content = message.get("content")
    where = f"messages[{i}].content"
    if content is None:
        if message.get("role") == "assistant":
            return ""
        raise bad(f"'{where}' is required", where, "missing_required_parameter")
    if images is not None and isinstance(content, list) and any(
            isinstance(item, dict) and item.get("type") in MEDIA_PARTS for item in content):
        return _with_media(content, where, images)
    return joined_text(content, where)


MEDIA_PARTS = ("image_url", "input_audio")


def _with_media(content: list, where: str, media: list[str]) -> str:
    """Text, image and audio parts as the text the engine renders, wire.MEDIA_MARKER standing where each image or
    sound goes (its base64 appended to `media`, in order), as llama-server lays a multimodal message out."""
    texts = []
    for j, item in enumerate(content):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "image_url":
            media.append(image_url_payload(item.get("image_url"), f"{where}[{j}].image_url"))
            texts.append(wire.MEDIA_MARKER)
        elif kind == "input_audio":
            media.append(input_audio_payload(item.get("input_audio"), f"{where}[{j}].input_audio"))
            texts.append(wire.MEDIA_MARKER)
        else:
            texts.append(joined_text([item], where))
    return "".join(texts)


def input_audio_payload(value, where: str) -> str:
    """An input_audio part's sound ({"data": base64, "format": "wav" | "mp3"}, FLAC too), as its base64 text: a
    WAV, MP3 or FLAC file by its signature, of at most MAX_IMAGE_BYTES."""
    if not isinstance(value, dict) or not isinstance(value.get("data"), str):
        raise bad(f"'{where}' must be {{\"data\": BASE64, \"format\": \"wav\"}}", where, "invalid_type")
    payload = value["data"]
    if len(payload) * 3 // 4 > MAX_IMAGE_BYTES:
        raise bad(f"'{where}.data': a sound may be at most {MAX_IMAGE_BYTES >> 20} MiB", f"{where}.data",
                  "audio_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"'{where}.data' is not valid base64", f"{where}.data", "invalid_audio") from None
    if audio_format(data) is None:
        raise bad(f"'{where}.data' is not a WAV, MP3 or FLAC sound", f"{where}.data", "invalid_audio")
    return payload


MAX_IMAGE_BYTES = 20 << 20  # one image, decoded (OpenAI's own limit)


def image_url_payload(value, where: str) -> str:
    """An image_url part's image, as its base64 text: a data: URI (data:image/png;base64,...) whose bytes are a
    PNG, JPEG, GIF or BMP image of at most MAX_IMAGE_BYTES. A remote URL is refused: the box does not fetch what
    a client names (it would reach the owner's LAN for them)."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise bad(f"'{where}' must be {{\"url\": \"data:image/png;base64,...\"}}", where, "invalid_type")
    if not url.startswith("data:"):
        raise bad(f"'{where}': remote image URLs are not fetched; send the image inline as a data: URI "
                  "(data:image/png;base64,...)", where, "unsupported_image_url")
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise bad(f"'{where}' must be a base64 data: URI (data:image/png;base64,...)", where, "invalid_image")
    return image_payload(payload, where)


def image_payload(payload, where: str) -> str:
    """An image as base64 text (every API's inline shape), checked: base64 of a PNG, JPEG, GIF or BMP image of at
    most MAX_IMAGE_BYTES. The text itself is what the engine is given."""
    if not isinstance(payload, str):
        raise bad(f"'{where}' must be the image as base64 text", where, "invalid_type")
    if len(payload) * 3 // 4 > MAX_IMAGE_BYTES:
        raise bad(f"'{where}': an image may be at most {MAX_IMAGE_BYTES >> 20} MiB", where, "image_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"'{where}' is not valid base64", where, "invalid_image") from None
    if image_format(data) is None:
        raise bad(f"'{where}' is not a PNG, JPEG, GIF or BMP image", where, "invalid_image")
    size = image_size(data)
    if size is None:
        raise bad(f"'{where}': its header gives no width and height (a damaged image?)", where, "invalid_image")
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise bad(f"'{where}' is {size[0]}x{size[1]} pixels: at most {MAX_IMAGE_PIXELS // 1_000_000} million "
                  "(the projector scales every image down to its own size anyway)", where, "image_too_large")
    return payload


def _tool_calls_of(message: dict, i: int) -> list[dict] | None:
    calls = message.get("tool_calls")
    if calls is None:
        return None
    where = f"messages[{i}].tool_calls"
    if message.get("role") != "assistant":
        raise bad(f"'{where}' is only allowed on assistant messages", where)
    if not isinstance(calls, list) or not calls:
        raise bad(f"'{where}' must be a non-empty array of tool calls", where, "invalid_type")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(fn, dict) or not isinstance(call.get("id"), str) or call.get("type", "function") != "function"
                or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str)):
            raise bad(f"'{where}[{j}]' must be {{\"id\": str, \"type\": \"function\", \"function\": "
                      "{\"name\": str, \"arguments\": str}}", f"{where}[{j}]", "invalid_type")
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    return out


def chat_messages(messages, images: list[str] | None = None) -> list[dict]:
    """The conversation, checked message by message, in the shape the engine renders; image parts' images
    appended to `images` (None: image parts refused, as text-only APIs do)."""
    if messages is None:
        raise bad("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise bad("'messages' must be an array of messages", "messages", "invalid_type")
    if not messages:
        raise bad("'messages' must contain at least one message", "messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(f"'messages[{i}]' must be an object with 'role' and 'content'", f"messages[{i}]", "invalid_type")
        role = message.get("role")
        if role in UNSUPPORTED_ROLES:
            raise bad(f"'messages[{i}].role' is {role!r}: the legacy function-calling API is not supported; use "
                      "'tools' and 'tool' messages", f"messages[{i}].role")
        if role not in CHAT_ROLES:
            raise bad(f"'messages[{i}].role' must be one of {sorted(CHAT_ROLES)}, got {role!r}", f"messages[{i}].role")
        calls = _tool_calls_of(message, i)
        entry = {"role": "system" if role == "developer" else role,  # templates know only 'system'
                 "content": "" if calls and message.get("content") is None else _message_content(message, i, images)}
        if calls:
            entry["tool_calls"] = calls
        if role == "assistant" and isinstance(message.get("reasoning_content"), str):
            entry["reasoning_content"] = message["reasoning_content"]  # thinking templates render it back
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise bad(f"'messages[{i}].tool_call_id' is required on a tool message", f"messages[{i}].tool_call_id",
                          "missing_required_parameter")
            entry["tool_call_id"] = message["tool_call_id"]
        rendered.append(entry)
    return rendered


def parse_chat(body: dict, served_model: str, tool_format: str = "generic") -> GenerationCall:
    check_model(body, served_model)
    req = check(request_models.ChatRequest, body)
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise bad("'functions' is the legacy function-calling API; send 'tools' instead", "functions",
                  "unsupported_parameter")
    images: list[str] = []
    rendered = chat_messages(body.get("messages"), images)
    tools = parse_tools(body)
    choice = parse_tool_choice(body, tools)
    common = _sampling_and_common(req, None)
    grammar = common.sampling["grammar"]
    if choice.constrained:
        if grammar is not None:
            raise bad("'response_format' and a required tool call cannot both constrain the answer", "tool_choice")
        grammar = grammar_for(tool_format, tools, choice)
    logprobs, top_logprobs = bool(req.logprobs), req.top_logprobs
    if top_logprobs is not None and not logprobs:
        raise bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    offered = tools if choice.mode != "none" else []
    prompt = wire.ChatPrompt(rendered, [t.wire() for t in offered] or None, choice.parallel,
                             template_kwargs(req.chat_template_kwargs, req.reasoning_effort), media=images or None)
    request = _generate(common, prompt, grammar=grammar, top_logprobs=(top_logprobs or 0) if logprobs else None)
    return GenerationCall(request, common.stream, common.include_usage, logprobs, tools=offered, tool_choice=choice,
                          reasoning=req.reasoning_format != "none")


MAX_TEMPLATE_KWARGS_BYTES = 4096


def template_kwargs(chat_template_kwargs: dict | None, reasoning_effort: str | None = None) -> dict | None:
    """`chat_template_kwargs` (llama-server's and vLLM's: variables the chat template reads, e.g. Qwen3's
    enable_thinking) and `reasoning_effort` (read by templates that have one), checked and bounded."""
    kwargs = dict(chat_template_kwargs or {})
    if len(json.dumps(kwargs)) > MAX_TEMPLATE_KWARGS_BYTES:
        raise bad(f"'chat_template_kwargs' is over {MAX_TEMPLATE_KWARGS_BYTES} bytes", "chat_template_kwargs")
    if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise bad("'chat_template_kwargs' keys must be identifiers", "chat_template_kwargs")
    if reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", reasoning_effort)
    return kwargs or None


def infill_extra(files: list[request_models.InfillFile] | None) -> list[dict]:
    """llama-server's input_extra (checked by request_models.InfillExtra): other files given as context."""
    return [{"filename": f.filename or "", "text": f.text or ""} for f in files or []]


def parse_completion(body: dict, served_model: str, after: str | None = None) -> GenerationCall:
    check_model(body, served_model)
    req = check(request_models.CompletionRequest, body)
    prompt = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise bad("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(prompt, list):
        raise bad("'prompt' must be a single string; send one request per prompt", "prompt", "unsupported_value")
    if not isinstance(prompt, str):
        raise bad("'prompt' must be a string", "prompt", "invalid_type")
    suffix = req.suffix  # fill in the middle: the prompt is the text before the cursor
    if not prompt and suffix is None:
        raise bad("'prompt' must not be empty", "prompt")
    if req.echo:
        raise bad("'echo' is not supported by this server", "echo", "unsupported_parameter")
    if (req.best_of or 1) > 1:
        raise bad("'best_of' greater than 1 is not supported; use 'n'", "best_of", "unsupported_parameter")
    common = _sampling_and_common(req, COMPLETIONS_DEFAULT_MAX_TOKENS)
    top_logprobs = req.logprobs
    text = wire.TextPrompt(prompt) if suffix is None else \
        wire.InfillPrompt(prompt, suffix, extra=infill_extra(req.input_extra), after=after or "")
    request = _generate(common, text, top_logprobs=top_logprobs)
    return GenerationCall(request, common.stream, common.include_usage, top_logprobs is not None)


@dataclass
class EmbeddingCall:
    inputs: list[str]
    encoding_format: str


def parse_embeddings(body: dict, served_model: str) -> EmbeddingCall:
    check_model(body, served_model)
    request = check(request_models.EmbeddingRequest, body)
    inputs = [request.input] if isinstance(request.input, str) else list(request.input)
    fmt = request.encoding_format or "float"
    if (request.model_extra or {}).get("dimensions") is not None:
        raise bad("'dimensions' is not supported: this model's embeddings have a fixed size", "dimensions",
                  "unsupported_parameter")
    return EmbeddingCall(inputs, fmt)


@dataclass(frozen=True)
class RerankCall:
    query: str
    documents: list[str]
    top_n: int
    return_documents: bool


def parse_rerank(body: dict, served_model: str) -> RerankCall:
    """llama-server's /v1/rerank, in Jina's and Cohere's shape: a query, documents (strings, or objects with a
    `text`), top_n (default: all), return_documents (default false)."""
    check_model(body, served_model)
    request = check(request_models.RerankRequest, body)
    texts = [doc if isinstance(doc, str) else doc.text for doc in request.documents]
    top_n = len(texts) if request.top_n is None else min(request.top_n, len(texts))
    return RerankCall(request.query, texts, top_n, bool(request.return_documents))




def parse_tokenize(body: dict) -> wire.Tokenize:
    """llama-server's /tokenize: {"content": str, "add_special": bool, "with_pieces": bool}."""
    request = check(request_models.TokenizeRequest, body)
    return wire.Tokenize(request.content, bool(request.add_special), bool(request.with_pieces))


def parse_detokenize(body: dict) -> wire.Detokenize:
    return wire.Detokenize(list(check(request_models.DetokenizeRequest, body).tokens))
