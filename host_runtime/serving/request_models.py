"""The API's request bodies as typed models (pydantic): each route's body is checked by its model before the
protocol modules turn it into an engine call, and the OpenAPI document's request schemas are generated from the same
models (serving/openapi.py), so what the document says and what the box accepts cannot disagree.

A model holds each field's shape and its own rule (type, bounds, allowed values, sizes). What depends on several
fields or on the served model (top_logprobs only with logprobs, a tool_choice naming an offered tool, a JSON
Schema's cost, roles' rules) stays with the protocol module that knows it. Unknown fields are allowed, as OpenAI's,
Anthropic's and Ollama's servers allow them; null is "not given", as clients send it.

Errors: the first broken rule, as the API's 400 naming the field (`param`, with [i] for list items), in the words
the hand-written checks used."""

from __future__ import annotations

import typing
from typing import Annotated, Literal, Optional, TypeVar, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from host_runtime.common.setting_rules import (BOUND_ERRORS, LENGTH_ERRORS, adapter, bound_words, hint_parts,
                                               length_words, one_of)
from host_runtime.serving.errors import APIError

MAX_N = 4
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
MAX_STOP_LENGTH = 256
MAX_EMBEDDING_INPUTS = 64
MAX_INFILL_EXTRA = 64
REASONING_EFFORTS = ("minimal", "low", "medium", "high")
REASONING_FORMATS = ("auto", "deepseek", "none")

TOOL_NAME = r"^[A-Za-z0-9_.-]{1,64}$"

PositiveInt = Annotated[int, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]
NonEmptyText = Annotated[str, Field(min_length=1)]
Json = dict  # any JSON object (a JSON Schema, a tool's input...): the protocol modules read it


class Body(BaseModel):
    """A request body or a part of one: JSON types as they are (no "10" for 10, no true for 1)."""
    model_config = ConfigDict(extra="allow", strict=True)


# ---- OpenAI: chat and completions ------------------------------------------------------------------------------

StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]
Stop = Union[StopString, Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]]
MAX_LOGIT_BIAS = 300  # OpenAI's ceiling
# Token ids (ASCII digits: str.isdigit() would take superscripts and other scripts' digits) -> a bias.
TokenId = Annotated[str, Field(pattern=r"^[0-9]{1,9}$", description="keyed by token ids")]
LogitBias = Annotated[dict[TokenId, Annotated[float, Field(ge=-100, le=100)]],
                      Field(max_length=MAX_LOGIT_BIAS)]


class StreamOptions(Body):
    include_usage: Optional[bool] = None


class JsonSchemaFormat(Body):
    name: Optional[str] = None
    schema_: Optional[Json] = Field(None, alias="schema")


class ResponseFormat(Body):
    type: Optional[Literal["text", "json_object", "json_schema"]] = None
    json_schema: Optional[JsonSchemaFormat] = None


class Sampling(Body):
    """The fields chat and completions share."""
    model: Optional[str] = None
    max_tokens: Optional[PositiveInt] = None
    max_completion_tokens: Optional[PositiveInt] = None
    n: Optional[Annotated[int, Field(ge=1, le=MAX_N)]] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    seed: Optional[int] = None
    speculation: Optional[bool] = Field(None, description="EveryCycle: false turns speculative decoding off for this "
                                                          "request (its output is the same either way).")
    stop: Optional[Stop] = None
    logit_bias: Optional[LogitBias] = None
    response_format: Optional[ResponseFormat] = None


class FunctionCall(Body):
    name: str
    arguments: str


class ToolCall(Body):
    id: str
    type: Optional[Literal["function"]] = None
    function: FunctionCall


class FunctionSpec(Body):
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    description: Optional[str] = None
    parameters: Optional[Json] = None


class Tool(Body):
    # Any other kind (retrieval...) is refused by tool_calls.parse_tools naming the tool, not its type field.
    type: str = Field(description="function: the only kind of tool offered to a model here")
    function: FunctionSpec


class ImageUrl(Body):
    url: str = Field(description="the image inline, as a data: URI (data:image/png;base64,...): PNG, JPEG, GIF or "
                                 "BMP, at most 20 MiB; a remote URL is refused (the box fetches nothing a client "
                                 "names)")


class InputAudio(Body):
    data: str = Field(description="the sound, base64: WAV, MP3 or FLAC, at most 20 MiB")
    format: Optional[str] = Field(None, description="wav or mp3 (the bytes' own signature decides)")


class ContentPart(Body):
    type: str = Field(description="text; image_url for a model served with a vision projector, input_audio for one "
                                  "whose projector takes audio (serve --mmproj)")
    text: Optional[str] = None
    image_url: Optional[ImageUrl] = None
    input_audio: Optional[InputAudio] = None


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"] = Field(
        description="function is the deprecated form of tool, refused with a pointer to tools")
    content: Union[str, list[ContentPart], None] = None
    tool_call_id: Optional[str] = None
    tool_calls: Optional[Annotated[list[ToolCall], Field(min_length=1)]] = None


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Sampling):
    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: Optional[bool] = None
    top_logprobs: Optional[TopLogprobs] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    chat_template_kwargs: Optional[Json] = Field(
        None, description="variables the model's chat template reads (e.g. Qwen3's enable_thinking): identifier "
                          "keys, at most 4 KiB, not the renderer's own names")
    reasoning_effort: Optional[one_of(REASONING_EFFORTS)] = Field(
        None, description="for templates that read a reasoning effort")
    reasoning_format: Optional[one_of(REASONING_FORMATS)] = Field(
        None, description="none: a thinking model's text as it is; otherwise its reasoning apart, as "
                          "message.reasoning_content")


class InfillFile(Body):
    filename: Optional[str] = None
    text: Optional[str] = None


InfillExtra = Annotated[list[InfillFile], Field(max_length=MAX_INFILL_EXTRA,
                                                description="with a suffix: other files as context (llama-server's)")]


class CompletionRequest(Sampling):
    model: str
    # Empty only with a suffix (fill in the middle); a list of one string is that string, of more refused with the
    # reason (one prompt a request): the protocol's rules.
    prompt: Union[str, list]
    logprobs: Optional[TopLogprobs] = None
    echo: Optional[bool] = None
    best_of: Optional[PositiveInt] = None
    suffix: Optional[str] = Field(None, description="fill in the middle: the text after the cursor (the prompt is the "
                                                    "text before it); needs a model with FIM tokens")
    input_extra: Optional[InfillExtra] = None


class InfillRequest(Body):
    """llama-server's /infill"""
    model: Optional[str] = None
    input_prefix: Optional[str] = None
    input_suffix: Optional[str] = None
    input_extra: Optional[InfillExtra] = None
    prompt: Optional[str] = Field(None, description="text after the middle token")
    n_predict: Optional[Annotated[int, Field(ge=-1)]] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    seed: Optional[int] = None
    stream: Optional[bool] = None


EmbeddingInput = Union[NonEmptyText, Annotated[list[str], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]]


class EmbeddingRequest(Body):
    model: str
    input: EmbeddingInput
    encoding_format: Optional[Literal["float", "base64"]] = None


class TokenizeRequest(Body):
    content: str
    add_special: Optional[bool] = None
    with_pieces: Optional[bool] = None


MAX_DETOKENIZE = 1 << 16


class DetokenizeRequest(Body):
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_DETOKENIZE)]


class RerankDocument(Body):
    text: str


class RerankRequest(Body):
    model: Optional[str] = None
    query: NonEmptyText
    documents: Annotated[list[Union[str, RerankDocument]], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    top_n: Optional[PositiveInt] = None
    return_documents: Optional[bool] = None


# ---- Anthropic's Messages -----------------------------------------------------------------------------------------

class TextBlock(Body):
    type: Literal["text"]
    text: str


class ToolUseBlock(Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: Json


class ToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Union[str, list, None] = None
    is_error: Optional[bool] = None


class AnthropicMessage(Body):
    role: Literal["user", "assistant"]
    # Blocks are read by anthropic_protocol (each kind's rules, and kinds this box does not take, named there).
    content: Union[str, list[dict]]


class AnthropicTool(Body):
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    description: Optional[str] = None
    input_schema: Optional[Json] = Field(None, description="default: no parameters")


class AnthropicToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None


class Thinking(Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Optional[int] = None


class OutputFormat(Body):
    type: Literal["json_schema"]
    schema_: Json = Field(alias="schema")


class OutputConfig(Body):
    format: Optional[OutputFormat] = None


class CountTokensRequest(Body):
    """/v1/messages/count_tokens: a Messages body, max_tokens not needed."""
    model: str
    max_tokens: Optional[PositiveInt] = None
    system: Union[str, list[TextBlock], None] = None
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    stop_sequences: Optional[Annotated[list[NonEmptyText], Field(max_length=MAX_STOP_STRINGS)]] = None
    temperature: Optional[Annotated[float, Field(ge=0, le=1)]] = None
    top_p: Optional[TopP] = None
    stream: Optional[bool] = None
    tools: Optional[list[AnthropicTool]] = None
    tool_choice: Optional[AnthropicToolChoice] = None
    metadata: Optional[Json] = None
    thinking: Optional[Thinking] = Field(None, description="a thinking model's reasoning as thinking blocks (not "
                                                           "disabled), or left out")
    output_config: Optional[OutputConfig] = None


class MessagesRequest(CountTokensRequest):
    max_tokens: PositiveInt


# ---- OpenAI's Responses -------------------------------------------------------------------------------------------

class ResponsesTool(Body):
    type: str = Field(description="function; namespace, whose own function tools are offered; a hosted tool "
                                  "(web_search, file_search...) is left out; any other kind is refused")
    name: Optional[str] = None
    tools: Optional[list[dict]] = Field(None, description="a namespace's tools")
    description: Optional[str] = None
    parameters: Optional[Json] = None


class ResponsesNamedTool(Body):
    type: Literal["function"]
    name: str


class TextFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    schema_: Optional[Json] = Field(None, alias="schema")


class ResponsesText(Body):
    format: Optional[TextFormat] = None


class ResponsesReasoning(Body):
    effort: Optional[one_of(REASONING_EFFORTS)] = Field(None, description="for templates that read one (gpt-oss)")


class ResponsesRequest(Body):
    model: str
    # Items (message, function_call, function_call_output, reasoning) are read by responses_protocol, each by its kind.
    input: Union[NonEmptyText, Annotated[list[dict], Field(min_length=1)]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[PositiveInt] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    stream: Optional[bool] = None
    parallel_tool_calls: Optional[bool] = None
    tools: Optional[list[ResponsesTool]] = None
    tool_choice: Union[Literal["auto", "none", "required"], ResponsesNamedTool, None] = None
    text: Optional[ResponsesText] = None
    reasoning: Optional[ResponsesReasoning] = None


# ---- Ollama -------------------------------------------------------------------------------------------------------

class OllamaOptions(Body):
    """temperature, top_p, seed, num_predict, stop, presence_penalty and frequency_penalty are used; other options
    are ignored"""
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    seed: Optional[int] = None
    num_predict: Optional[Annotated[int, Field(ge=-2)]] = None
    stop: Optional[Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]],
                             Field(max_length=MAX_STOP_STRINGS)]] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None


KeepAlive = Union[str, float]


class OllamaGeneration(Body):
    model: str
    stream: Optional[bool] = Field(None, description="default true, as Ollama")
    options: Optional[OllamaOptions] = None
    format: Union[Literal["json"], Json, None] = None
    keep_alive: Optional[KeepAlive] = None
    think: Union[bool, Literal["low", "medium", "high"], None] = Field(
        None, description="a thinking model's reasoning as message.thinking or thinking (false: the template is "
                          "asked not to think)")


class OllamaMessage(Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: Optional[str] = None  # an assistant's message of tool calls may have none
    tool_name: Optional[str] = None


class OllamaChatRequest(OllamaGeneration):
    messages: list[OllamaMessage] = Field(description="empty (or absent): the model is loaded, or with keep_alive 0 "
                                                      "unloaded, and nothing is generated (Ollama's idiom)")
    tools: Optional[list[Tool]] = None


class OllamaGenerateRequest(OllamaGeneration):
    prompt: str = Field(description="empty (or absent) and no suffix: the model is loaded, or with keep_alive 0 "
                                    "unloaded, and nothing is generated (Ollama's idiom)")
    system: Optional[str] = None
    raw: Optional[bool] = None
    suffix: Optional[str] = Field(None, description="fill in the middle: the text after the cursor")


class OllamaEmbedRequest(Body):
    model: str
    input: EmbeddingInput
    keep_alive: Optional[KeepAlive] = None


class OllamaEmbeddingsRequest(Body):
    model: str
    prompt: NonEmptyText


class OllamaShowRequest(Body):
    model: str


class OllamaPullRequest(Body):
    model: Optional[str] = Field(None, description="where the GGUF is: an http(s) URL or hf://OWNER/REPO/FILE.gguf "
                                                   "(there is no Ollama registry here); older clients send it as name")
    name: Optional[str] = None
    insecure: Optional[bool] = Field(None, description="ignored")
    stream: Optional[bool] = Field(None, description="default true, as Ollama")


class OllamaDeleteRequest(Body):
    model: str = Field(description="the store model to remove, its tag optional")


class OllamaCopyRequest(Body):
    source: str = Field(description="the store model to copy, its tag optional")
    destination: str = Field(description="its second name (the same file, hard-linked)")


class UnroutableRequest(Body):
    """Read leniently by fleet_unroutable (it explains why the fleet could not route; a body it cannot read still
    gets that explanation), so documented here and not checked."""
    model: Optional[str] = None


# The models the document names, by the component name it gives each.
DOCUMENTED = (ChatRequest, CompletionRequest, InfillRequest, EmbeddingRequest, TokenizeRequest, DetokenizeRequest,
              RerankRequest, MessagesRequest, CountTokensRequest, ResponsesRequest, OllamaChatRequest,
              OllamaGenerateRequest, OllamaEmbedRequest, OllamaEmbeddingsRequest, OllamaShowRequest, OllamaPullRequest,
              OllamaDeleteRequest, OllamaCopyRequest, UnroutableRequest)


# ---- checking a body -----------------------------------------------------------------------------------------------

TYPE_NAMES = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "a boolean",
              "list_type": "an array", "dict_type": "an object", "model_type": "an object"}
KINDS = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object", list: "an array"}


def _param(loc) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _parts(hint) -> tuple:
    """hint_parts (type, metadata, description) of a type, Optional[X] read as X (null is "not given")."""
    parts = hint_parts(hint)
    if typing.get_origin(parts[0]) is Union:
        members = [a for a in typing.get_args(parts[0]) if a is not type(None)]
        if len(members) == 1:
            return hint_parts(members[0])
    return parts


def _plain(hint):
    """The type under Annotated and Optional."""
    return _parts(hint)[0]


def _kind(hint):
    """The JSON kind a type takes: str, int, float, bool, list or dict (a model is a dict)."""
    base = _plain(hint)
    origin = typing.get_origin(base) or base
    if origin is Literal:
        return type(typing.get_args(base)[0])
    if isinstance(origin, type) and issubclass(origin, BaseModel):
        return dict
    return origin


def _of_kind(value, kind) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _words(error: dict, param: str, hint) -> tuple[str, str]:
    """(message, code) for one pydantic error, in the words the API's own checks use."""
    kind, value = error["type"], error.get("input")
    if kind == "missing":
        return f"'{param}' is required", "missing_required_parameter"
    if kind in TYPE_NAMES:
        return f"'{param}' must be {TYPE_NAMES[kind]}, got {type(value).__name__}", "invalid_type"
    if kind == "literal_error":
        return f"'{param}' must be {error['ctx']['expected']}, got {value!r}", "invalid_value"
    if kind in BOUND_ERRORS:
        return f"'{param}' must be {bound_words(error, _parts(hint)[1])}, got {value}", "invalid_value"
    if kind in LENGTH_ERRORS:
        return f"'{param}' {length_words(error, 'items')}", "invalid_value"
    if kind == "string_pattern_mismatch":
        description = hint_parts(hint)[2]
        if description:
            return f"'{param}' must be {description}, got {value!r}", "invalid_value"
        return f"'{param}' must match {error['ctx']['pattern']}, got {value!r}", "invalid_value"
    return f"'{param}': {error['msg']}", "invalid_value"


def _refuse(hint, value, path: tuple) -> None:
    """Raise the API's 400 for the first rule `value` (at `path` in the body) breaks of type `hint`."""
    try:
        adapter(hint).validate_python(value)
        return
    except pydantic.ValidationError as exc:
        error = exc.errors(include_url=False)[0]
    for part in error["loc"]:
        base = _plain(hint)
        if typing.get_origin(base) is Union:
            break
        if isinstance(base, type) and issubclass(base, BaseModel):
            name = next((n for n, f in base.model_fields.items() if (f.alias or n) == part), None)
            if name is None:
                break
            hint = typing.get_type_hints(base, include_extras=True)[name]
            value = value.get(part) if isinstance(value, dict) else None
        elif typing.get_origin(base) is dict:
            # A table's keys are the client's data (token ids...): an error in a key or a value names the table,
            # in the words of the key's or the value's own rule.
            key_type, value_type = typing.get_args(base)
            inner = error["loc"][len(error["loc"]) - 1] == "[key]"
            hint, value = (key_type, part) if inner else (value_type, value.get(part) if isinstance(value, dict) else None)
            message, code = _words(error, _param(path), hint)
            raise APIError(400, message, param=_param(path), code=code)
        elif typing.get_origin(base) is list:
            hint = typing.get_args(base)[-1]
            try:
                value = value[part]
            except (KeyError, IndexError, TypeError):
                value = None
        else:
            break
        path = (*path, part)
    base = _plain(hint)
    if typing.get_origin(base) is Union and error["type"] != "missing":
        # A union (a string or an array...): the member the value's JSON kind is, checked alone, so that the error
        # is the one inside it (an item of the wrong type, a list too long); no such member: the kinds it may be.
        members = [m for m in typing.get_args(base) if m is not type(None)]
        for member in members:
            if _of_kind(value, _kind(member)):
                _refuse(member, value, path)
                return
        kinds = " or ".join(dict.fromkeys(
            " or ".join(repr(v) for v in typing.get_args(_plain(m))) if typing.get_origin(_plain(m)) is Literal
            else KINDS.get(_kind(m), "an object") for m in members))
        param = _param(path)
        raise APIError(400, f"'{param}' must be {kinds}, got {type(value).__name__}", param=param,
                       code="invalid_type")
    if error["type"] == "missing" and len(path) > 1:
        # A part of the body without a field it needs: the part is named, as the protocol modules name it.
        param = _param(path[:-1])
        raise APIError(400, f"'{param}' needs '{path[-1]}'", param=param, code="missing_required_parameter")
    param = _param(path)
    message, code = _words(error, param, hint)
    raise APIError(400, message, param=param or None, code=code)


CheckedBody = TypeVar("CheckedBody", bound=BaseModel)


def check(model: type[CheckedBody], body: dict) -> CheckedBody:
    """`body` as `model`, or the API's 400 naming the first field that breaks its rule."""
    try:
        return model.model_validate(body)
    except pydantic.ValidationError:
        _refuse(model, body, ())
        raise  # _refuse raised: only unreachable if pydantic and the walk disagree
