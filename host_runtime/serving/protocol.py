"""The wire schema (pure): OpenAI request bodies checked field by field into engine calls.

Every refusal names the field (`param`) and what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from host_runtime.engine import wire
from host_runtime.serving.errors import APIError
from host_runtime.serving.grammar_budget import MAX_SCHEMA_GRAMMAR_BYTES, GrammarBudget, check_grammar_size
from host_runtime.serving.tool_calls import ToolCallStream, grammar_for, parse_output, parse_tool_choice, parse_tools

MAX_N = 4
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
MAX_STOP_LENGTH = 256
MAX_EMBEDDING_INPUTS = 64
MAX_LOGIT_BIAS = 300  # OpenAI's ceiling
# JSON bodies nest at most this deep: Python's parser would otherwise recurse until RecursionError.
MAX_JSON_DEPTH = 64
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}
UNSUPPORTED_ROLES = {"function"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


NO_LIMIT = 1 << 30  # max_tokens for "no limit" (Ollama's, llama-server's): the engine ends where the context does


def bad(message: str, param: str, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _type_name(types) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in types)


def field_of(body: dict, name: str, types, default=None):
    """body[name] if present and of `types` (bool is never an int here), else the default."""
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
        raise bad(f"'{name}' must be {_type_name(types)}, got {type(value).__name__}", name, "invalid_type")
    return value


def number_in(body: dict, name: str, low: float, high: float, default):
    value = field_of(body, name, float, default)
    if value is not None and not (low <= value <= high):
        raise bad(f"'{name}' must be between {low:g} and {high:g}, got {value}", name)
    return value


def int_in(body: dict, name: str, low: int, high: int | None, default):
    value = field_of(body, name, int, default)
    if value is not None and (value < low or (high is not None and value > high)):
        limit = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise bad(f"'{name}' must be {limit}, got {value}", name)
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
        from host_runtime.serving.reasoning import split

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


def _stop_strings(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("'stop' must be a string or an array of strings", "stop", "invalid_type")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad(f"'stop' has {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed", "stop")
    for s in stop:
        if not s or len(s) > MAX_STOP_LENGTH:
            raise bad(f"each stop string must be 1 to {MAX_STOP_LENGTH} characters", "stop")
    return stop


def _logit_bias(body: dict) -> dict[str, float] | None:
    bias = field_of(body, "logit_bias", dict)
    if not bias:
        return None
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad(f"'logit_bias' has {len(bias)} entries; at most {MAX_LOGIT_BIAS} are allowed", "logit_bias")
    out = {}
    for token, value in bias.items():
        # str.isdigit() accepts superscripts and other scripts' digits that int() refuses; token ids are ASCII.
        if not (token.isascii() and token.isdigit()) or len(token) > 9:
            raise bad(f"'logit_bias' keys must be token ids, got {token!r}", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise bad(f"'logit_bias[{token}]' must be a number from -100 to 100", "logit_bias")
        out[str(int(token))] = float(value)
    return out


def _response_format_grammar(body: dict) -> str | None:
    fmt = field_of(body, "response_format", dict)
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

    if kind == "json_object":
        return JSON_GBNF
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise bad("'response_format.json_schema.schema' must be a JSON Schema object",
                      "response_format.json_schema.schema", "invalid_type")
        where = "response_format.json_schema.schema"
        GrammarBudget().charge(spec["schema"], where)  # before converting: the converter's work is bounded too
        try:
            grammar = LlamaGrammar.from_json_schema(json.dumps(spec["schema"]), verbose=False)._grammar
        except Exception as exc:  # the converter raises bare Exceptions (and KeyErrors) for what it cannot do
            raise bad(f"this JSON Schema cannot be turned into a grammar: {type(exc).__name__}: {exc}",
                      where) from None
        return check_grammar_size(grammar, MAX_SCHEMA_GRAMMAR_BYTES, where, "this JSON Schema")
    raise bad(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
              "response_format.type")


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


def _sampling_and_common(body: dict, default_max_tokens: int | None) -> _Common:
    max_tokens = int_in(body, "max_completion_tokens", 1, None, None)
    if max_tokens is None:
        max_tokens = int_in(body, "max_tokens", 1, None, default_max_tokens)
    n = int_in(body, "n", 1, MAX_N, 1)
    stream = field_of(body, "stream", bool, False)
    options = field_of(body, "stream_options", dict)
    include_usage = False
    if options is not None:
        if not stream:
            raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = field_of(options, "include_usage", bool, False)
    temperature = number_in(body, "temperature", 0.0, 2.0, 1.0)
    sampling = {
        "temperature": temperature,
        "top_p": number_in(body, "top_p", 0.0, 1.0, 1.0),
        "presence_penalty": number_in(body, "presence_penalty", -2.0, 2.0, 0.0),
        "frequency_penalty": number_in(body, "frequency_penalty", -2.0, 2.0, 0.0),
        "seed": field_of(body, "seed", int),
        "grammar": _response_format_grammar(body),
        "logit_bias": _logit_bias(body),
    }
    if sampling["top_p"] == 0.0:
        raise bad("'top_p' must be greater than 0", "top_p")
    # EveryCycle's own field `speculation`: false opts this request out of speculative decoding (the output is
    # the same either way; a client measuring the model's own speed may want it off).
    return _Common(max_tokens, n, stream, include_usage, _stop_strings(body),
                   field_of(body, "speculation", bool, True), sampling)


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


def _message_content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        if message.get("role") == "assistant":
            return ""
        raise bad(f"'messages[{i}].content' is required", f"messages[{i}].content", "missing_required_parameter")
    return joined_text(content, f"messages[{i}].content")


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


def chat_messages(messages) -> list[dict]:
    """The conversation, checked message by message, in the shape the engine renders."""
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
                 "content": "" if calls and message.get("content") is None else _message_content(message, i)}
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
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise bad("'functions' is the legacy function-calling API; send 'tools' instead", "functions",
                  "unsupported_parameter")
    rendered = chat_messages(body.get("messages"))
    tools = parse_tools(body)
    choice = parse_tool_choice(body, tools)
    common = _sampling_and_common(body, None)
    grammar = common.sampling["grammar"]
    if choice.constrained:
        if grammar is not None:
            raise bad("'response_format' and a required tool call cannot both constrain the answer", "tool_choice")
        grammar = grammar_for(tool_format, tools, choice)
    logprobs = field_of(body, "logprobs", bool, False)
    top_logprobs = int_in(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, None)
    if top_logprobs is not None and not logprobs:
        raise bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    offered = tools if choice.mode != "none" else []
    prompt = wire.ChatPrompt(rendered, [t.wire() for t in offered] or None, choice.parallel, template_kwargs(body))
    request = _generate(common, prompt, grammar=grammar, top_logprobs=(top_logprobs or 0) if logprobs else None)
    return GenerationCall(request, common.stream, common.include_usage, logprobs, tools=offered, tool_choice=choice,
                          reasoning=reasoning_format(body) != "none")


REASONING_EFFORTS = ("minimal", "low", "medium", "high")
MAX_TEMPLATE_KWARGS_BYTES = 4096


def template_kwargs(body: dict, extra: dict | None = None) -> dict | None:
    """`chat_template_kwargs` (llama-server's and vLLM's: variables the chat template reads, e.g. Qwen3's
    enable_thinking) and `reasoning_effort` (read by templates that have one), checked and bounded."""
    kwargs = dict(field_of(body, "chat_template_kwargs", dict) or {})
    if len(json.dumps(kwargs)) > MAX_TEMPLATE_KWARGS_BYTES:
        raise bad(f"'chat_template_kwargs' is over {MAX_TEMPLATE_KWARGS_BYTES} bytes", "chat_template_kwargs")
    if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise bad("'chat_template_kwargs' keys must be identifiers", "chat_template_kwargs")
    effort = field_of(body, "reasoning_effort", str)
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise bad(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
        kwargs.setdefault("reasoning_effort", effort)
    kwargs.update(extra or {})
    return kwargs or None


def reasoning_format(body: dict) -> str:
    """llama-server's `reasoning_format`: "none" leaves a thinking model's text as it is; otherwise (deepseek,
    auto) its reasoning comes apart from the answer (serving/reasoning.py)."""
    value = field_of(body, "reasoning_format", str, "auto")
    if value not in ("auto", "deepseek", "none"):
        raise bad("'reasoning_format' must be auto, deepseek or none", "reasoning_format")
    return value


MAX_INFILL_EXTRA = 64


def infill_extra(value) -> list[dict]:
    """llama-server's input_extra: other files given as context, [{"filename": ..., "text": ...}]."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_INFILL_EXTRA:
        raise bad(f"'input_extra' must be a list of at most {MAX_INFILL_EXTRA} {{filename, text}} objects",
                  "input_extra")
    out = []
    for i, chunk in enumerate(value):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) or \
                not isinstance(chunk.get("filename", ""), str):
            raise bad(f"'input_extra[{i}]' must be an object with string 'filename' and 'text'", f"input_extra[{i}]")
        out.append({"filename": chunk.get("filename", ""), "text": chunk.get("text", "")})
    return out


def parse_completion(body: dict, served_model: str, after: str | None = None) -> GenerationCall:
    check_model(body, served_model)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise bad("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(prompt, list):
        raise bad("'prompt' must be a single string; send one request per prompt", "prompt", "unsupported_value")
    if not isinstance(prompt, str):
        raise bad("'prompt' must be a string", "prompt", "invalid_type")
    suffix = field_of(body, "suffix", str)  # fill in the middle: the prompt is the text before the cursor
    if not prompt and suffix is None:
        raise bad("'prompt' must not be empty", "prompt")
    if field_of(body, "echo", bool, False):
        raise bad("'echo' is not supported by this server", "echo", "unsupported_parameter")
    if int_in(body, "best_of", 1, None, 1) > 1:
        raise bad("'best_of' greater than 1 is not supported; use 'n'", "best_of", "unsupported_parameter")
    common = _sampling_and_common(body, COMPLETIONS_DEFAULT_MAX_TOKENS)
    top_logprobs = int_in(body, "logprobs", 0, MAX_TOP_LOGPROBS, None)
    text = wire.TextPrompt(prompt) if suffix is None else \
        wire.InfillPrompt(prompt, suffix, extra=infill_extra(body.get("input_extra")), after=after or "")
    request = _generate(common, text, top_logprobs=top_logprobs)
    return GenerationCall(request, common.stream, common.include_usage, top_logprobs is not None)


@dataclass
class EmbeddingCall:
    inputs: list[str]
    encoding_format: str


def parse_embeddings(body: dict, served_model: str) -> EmbeddingCall:
    check_model(body, served_model)
    data = body.get("input")
    if data is None:
        raise bad("'input' is required", "input", "missing_required_parameter")
    inputs = [data] if isinstance(data, str) else data
    if not isinstance(inputs, list) or not all(isinstance(s, str) for s in inputs):
        raise bad("'input' must be a string or an array of strings", "input", "invalid_type")
    if not inputs:
        raise bad("'input' must not be empty", "input")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise bad(f"'input' has {len(inputs)} items; at most {MAX_EMBEDDING_INPUTS} are allowed", "input")
    fmt = field_of(body, "encoding_format", str, "float")
    if fmt not in ("float", "base64"):
        raise bad(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    if body.get("dimensions") is not None:
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
    query = field_of(body, "query", str)
    if not query:
        raise bad("'query' is required and must not be empty", "query", "missing_required_parameter")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents:
        raise bad("'documents' must be a non-empty array of strings", "documents",
                  "missing_required_parameter" if documents is None else "invalid_type")
    if len(documents) > MAX_EMBEDDING_INPUTS:
        raise bad(f"'documents' has {len(documents)} items; at most {MAX_EMBEDDING_INPUTS} are allowed", "documents")
    texts = []
    for i, doc in enumerate(documents):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str):
            raise bad(f"'documents[{i}]' must be a string (or an object with a string 'text')", f"documents[{i}]",
                      "invalid_type")
        texts.append(text)
    top_n = field_of(body, "top_n", int, len(texts))
    if top_n < 1:
        raise bad(f"'top_n' must be at least 1, got {top_n}", "top_n")
    return RerankCall(query, texts, min(top_n, len(texts)), field_of(body, "return_documents", bool, False))


MAX_DETOKENIZE = 1 << 16


def parse_tokenize(body: dict) -> wire.Tokenize:
    """llama-server's /tokenize: {"content": str, "add_special": bool, "with_pieces": bool}."""
    content = field_of(body, "content", str)
    if content is None:
        raise bad("'content' is required", "content", "missing_required_parameter")
    return wire.Tokenize(content, field_of(body, "add_special", bool, False),
                         field_of(body, "with_pieces", bool, False))


def parse_detokenize(body: dict) -> wire.Detokenize:
    tokens = field_of(body, "tokens", list)
    if tokens is None:
        raise bad("'tokens' is required", "tokens", "missing_required_parameter")
    if len(tokens) > MAX_DETOKENIZE:
        raise bad(f"'tokens' has {len(tokens)} ids; at most {MAX_DETOKENIZE} are allowed", "tokens")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
        raise bad("'tokens' must be an array of token ids (non-negative integers)", "tokens", "invalid_type")
    return wire.Detokenize(tokens)
