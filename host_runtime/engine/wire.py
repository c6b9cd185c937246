"""The engine's wire (pure): every call an HTTP worker makes to an engine process and every reply and event it gets
back, as typed structures both sides import. One JSON object per line (engine/ipc.py frames them); a request
carries its op, a reply or event its type; nothing else in the tree reads those keys.

A generation is `Generate` -> `Accepted` (or `Error`), then `Token`s and one `Finish` per choice, then `Done`
(or `Error`). Every other op is answered by one reply: `Info` -> `EngineInfo`, `Ready` -> readiness.Verdict, and so
on (REPLY_OF). A refusal is an `Error` carrying the engine's RequestRejected.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from host_runtime.common.errors import InputError
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.readiness import Verdict


# The largest grammar a Generate may carry: the engine compiles no larger (sampling.CompiledGrammar), and the
# serving API's caps (serving/grammar_budget.py) are at or below it.
MAX_GRAMMAR_BYTES = 256 * 1024


# Priority classes, first served first: the queue orders by class, then arrival, and an interactive request that
# finds every sequence busy parks a lower class's (engine.py).
PRIORITIES = ("interactive", "default", "batch")


class WireError(InputError, ValueError):
    """A line that is not a well-formed engine message: the op or type unknown, a field missing or of a wrong type."""


def _build(cls, doc: dict, what: str, **overrides):
    """cls from the fields of `doc` it declares (WireError on a missing or unknown field)."""
    if not isinstance(doc, dict):
        raise WireError(f"{what} must be an object, got {type(doc).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = set(doc) - names - {"op", "type"}
    if unknown:
        raise WireError(f"{what}: unknown fields {sorted(unknown)}")
    try:
        return cls(**{**{k: v for k, v in doc.items() if k in names}, **overrides})
    except TypeError as exc:
        raise WireError(f"{what}: {exc}") from None


# ---- what a generation asks for -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    grammar: str | None = None  # GBNF, from response_format or a required tool call
    top_logprobs: int | None = None  # None: no logprobs; 0..N: chosen token plus N alternatives
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None  # token id (as text, from JSON) -> bias; -100 bans it

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


# Where an image (or audio) goes in a message's text: the API writes it for each image part, the engine's projector reads it
# (libmtmd's own default marker, engine/projector.py checks they agree).
MEDIA_MARKER = "<__media__>"


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation the engine renders with the model's chat template (messages in the template's shape)."""
    messages: list[dict]
    tools: list[dict] | None = None  # OpenAI-shaped tool definitions offered to the model
    parallel_tool_calls: bool = True
    # Variables the template reads beside the messages (chat_template_kwargs: enable_thinking, reasoning_effort)
    template_kwargs: dict | None = None
    # The request's images and audio, base64, in the order MEDIA_MARKER stands for them in the messages' text (#58)
    media: list[str] | None = None


@dataclass(frozen=True)
class TextPrompt:
    """Plain text, tokenized as it is (/v1/completions)."""
    text: str


@dataclass(frozen=True)
class InfillPrompt:
    """Fill in the middle (editor autocomplete): the text before and after the cursor, put around the model's FIM
    tokens by the engine; `extra` holds other files as context ({"filename", "text"}), `after` text that follows
    the middle token (llama-server's /infill `prompt`)."""
    prefix: str
    suffix: str
    extra: list[dict] = field(default_factory=list)
    after: str = ""


def _prompt_from_wire(doc) -> ChatPrompt | TextPrompt | InfillPrompt:
    if isinstance(doc, dict) and "messages" in doc:
        return _build(ChatPrompt, doc, "prompt")
    if isinstance(doc, dict) and "suffix" in doc:
        return _build(InfillPrompt, doc, "prompt")
    if isinstance(doc, dict) and "text" in doc:
        return _build(TextPrompt, doc, "prompt")
    raise WireError("prompt must have 'messages' or 'text'")


# ---- requests ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Generate:
    op: ClassVar[str] = "generate"
    prompt: ChatPrompt | TextPrompt | InfillPrompt
    max_tokens: int | None = None  # None: as many as the context leaves
    n: int = 1
    stop: list[str] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    speculation: bool = True  # False: this request opts out of speculative decoding (same output either way)
    cache_scope: str | None = None  # whose cached prefixes it may reuse (the key's scope, serving/key_privacy.py)
    priority: str = "default"       # one of PRIORITIES
    key: str | None = None          # the API key's name, for its limits (None: no key, no limits)
    key_max_concurrent: int = 0     # its requests running, parked or waiting at once, at most (0: no limit)
    key_tokens_per_minute: int = 0  # its tokens (prompt and generated) in any minute, at most (0: no limit)
    key_tokens_per_day: int = 0     # the same, in any 24 hours

    @classmethod
    def from_wire(cls, doc: dict) -> "Generate":
        return _build(cls, doc, "generate", prompt=_prompt_from_wire(doc.get("prompt")),
                      sampling=_build(SamplingParams, doc.get("sampling") or {}, "sampling"))


@dataclass(frozen=True)
class CountTokens:
    """How many tokens a conversation is once its template is rendered (Anthropic's count_tokens)."""
    op: ClassVar[str] = "count_tokens"
    prompt: ChatPrompt

    @classmethod
    def from_wire(cls, doc: dict) -> "CountTokens":
        prompt = _prompt_from_wire(doc.get("prompt"))
        if not isinstance(prompt, ChatPrompt):
            raise WireError("count_tokens: prompt must have 'messages'")
        return cls(prompt)


@dataclass(frozen=True)
class Tokenize:
    """llama-server's /tokenize (special markup parsed)."""
    op: ClassVar[str] = "tokenize"
    content: str
    add_special: bool = False
    with_pieces: bool = False


@dataclass(frozen=True)
class Detokenize:
    op: ClassVar[str] = "detokenize"
    tokens: list[int]


@dataclass(frozen=True)
class Embed:
    op: ClassVar[str] = "embed"
    inputs: list[str]


@dataclass(frozen=True)
class Rank:
    """A reranker's scores of documents for a query (a model with rank pooling)."""
    op: ClassVar[str] = "rank"
    query: str
    documents: list[str]


@dataclass(frozen=True)
class Transcribe:
    """A sound written down by a speech-to-text model (a Whisper model's engine, speech/service.py)."""
    op: ClassVar[str] = "transcribe"
    audio: str                  # the sound file's bytes, base64 (a WAV)
    language: str | None = None  # ISO 639-1; None: detected
    prompt: str | None = None    # earlier words, or the vocabulary to expect
    temperature: float = 0.0


@dataclass(frozen=True)
class Info:
    op: ClassVar[str] = "info"


@dataclass(frozen=True)
class Metrics:
    op: ClassVar[str] = "metrics"


@dataclass(frozen=True)
class Ready:
    """The readiness verdict; a canary runs when the last passed over max_age s ago; waits up to `wait` s for it."""
    op: ClassVar[str] = "ready"
    max_age: float = 5.0
    wait: float = 2.0


REQUESTS = {cls.op: cls for cls in (Generate, CountTokens, Tokenize, Detokenize, Embed, Rank, Transcribe, Info,
                                     Metrics, Ready)}


def request_to_wire(request) -> dict:
    return {"op": request.op, **asdict(request)}


def request_from_wire(doc) -> Any:
    """The typed request; WireError naming what is wrong."""
    op = doc.get("op") if isinstance(doc, dict) else None
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None or op is None:
        raise WireError(f"unknown engine op {op!r}")
    from_wire = getattr(cls, "from_wire", None)
    return from_wire(doc) if from_wire else _build(cls, doc, op)


# ---- replies and events ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TopLogprob:
    token: str
    bytes: list[int]
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    bytes: list[int]
    logprob: float
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class Accepted:
    type: ClassVar[str] = "accepted"
    prompt_tokens: int
    # How the answer starts, for a template that thinks (engine/reasoning.py MODES): "open" inside a think block,
    # "may-open" where the model may open one, "" where it does not think
    thinking: str = ""


@dataclass(frozen=True)
class Token:
    """Text of one choice (may be empty when only a logprob comes with it)."""
    type: ClassVar[str] = "token"
    index: int
    text: str
    logprob: TokenLogprob | None = None

    @classmethod
    def from_wire(cls, doc: dict) -> "Token":
        lp = doc.get("logprob")
        logprob = None if lp is None else _build(
            TokenLogprob, lp, "logprob", top=[_build(TopLogprob, t, "logprob.top") for t in lp.get("top", [])])
        return _build(cls, doc, "token", logprob=logprob)


@dataclass(frozen=True)
class Finish:
    """One choice ended: stop (end of generation or a stop string, `stop_string` saying which) or length."""
    type: ClassVar[str] = "finish"
    index: int
    finish_reason: str
    completion_tokens: int
    stop_string: str | None = None


@dataclass(frozen=True)
class Timings:
    """Where a generation's time went in the engine, in seconds from its arrival there, one phase after another:
    waiting for a slot, the prefix cache's restore, the prompt's prefill, then decoding to the end (which includes
    the time it spent parked by a higher class). For the serving API's trace (serving/tracing.py)."""
    queued_s: float = 0.0
    restore_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    parked_s: float = 0.0   # of decode_s: parked (engine.py _park_one_below), its KV in RAM or on disk
    preemptions: int = 0
    cache_hit: str = ""     # where its reused prefix came from: context, running, ram or disk; "" none


@dataclass(frozen=True)
class Done:
    """Every choice ended."""
    type: ClassVar[str] = "done"
    prompt_tokens: int
    cached_tokens: int = 0
    # Measurements, not the answer: two runs that answer alike are equal whatever their timings.
    timings: Timings | None = field(default=None, compare=False)

    @classmethod
    def from_wire(cls, doc: dict) -> "Done":
        timings = doc.get("timings")
        return _build(cls, doc, "done",
                      timings=None if timings is None else _build(Timings, timings, "done.timings"))


@dataclass(frozen=True)
class Error:
    """A refusal, or a generation that failed part way."""
    type: ClassVar[str] = "error"
    error: RequestRejected

    def to_wire(self) -> dict:
        return {"error": self.error.to_wire()}

    @classmethod
    def from_wire(cls, doc: dict) -> "Error":
        e = doc.get("error")
        if not isinstance(e, dict):
            raise WireError("error: 'error' must be an object")
        return cls(RequestRejected.from_wire(e))


@dataclass(frozen=True)
class TokenCount:
    type: ClassVar[str] = "token_count"
    prompt_tokens: int


@dataclass(frozen=True)
class Tokenized:
    """Token ids, or with_pieces: {"id", "piece"} objects as llama-server gives them."""
    type: ClassVar[str] = "tokenized"
    tokens: list


@dataclass(frozen=True)
class Detokenized:
    type: ClassVar[str] = "detokenized"
    content: str


@dataclass(frozen=True)
class Embeddings:
    type: ClassVar[str] = "embeddings"
    data: list[list[float]]
    prompt_tokens: int


@dataclass(frozen=True)
class Scores:
    type: ClassVar[str] = "scores"
    scores: list[float]   # one per document, in the request's order
    prompt_tokens: int


@dataclass(frozen=True)
class Transcript:
    """What a speech model heard: the text, its timed segments ({"start", "end", "text"}, seconds), the language
    (asked or detected), the sound's length and the tokens decoded (what a key's limits count)."""
    type: ClassVar[str] = "transcript"
    text: str
    segments: list[dict]
    language: str
    duration_s: float
    tokens: int


@dataclass(frozen=True)
class MetricsText:
    type: ClassVar[str] = "metrics"
    text: str


@dataclass(frozen=True)
class EngineInfo:
    """What an engine says about itself: its state, model and shape. `placement` is the planner's own document
    (placement.plan.Placement.to_json); `recent` the engine's recent figures (metrics.EngineMetrics.recent)."""
    type: ClassVar[str] = "info"
    state: str                      # loading, ready, failed
    reason: str
    model_id: str
    model_path: str
    pid: int
    busy: bool = False              # requests running or deferred
    load_progress: float | None = None
    tool_format: str | None = None
    n_ctx: int | None = None        # the context each sequence gets (what it is served at)
    n_ctx_train: int | None = None  # what the model was trained for (its GGUF's context_length)
    n_parallel: int | None = None
    max_waiting: int | None = None
    pooling: str | None = None      # an embedding or reranking model's pooling
    media: str | None = None        # what its projector takes: vision, audio, or vision,audio; None: text only
    task: str = "generate"          # what it answers: generate (and embed), or transcribe (a Whisper model)
    placement: dict | None = None
    recent: dict | None = None
    shards: list | None = None      # other boxes lending devices: [{host, devices, round_trip_ms, mbytes_per_s}]
    load_s: float | None = None     # seconds from the engine's start to ready (its model loaded and warmed up)

    @property
    def ready(self) -> bool:
        return self.state == "ready"


VERDICT = "verdict"  # readiness.Verdict's tag on the wire (it is readiness's own type)


EVENTS = {cls.type: cls for cls in (Accepted, Token, Finish, Done, Error, TokenCount, Tokenized, Detokenized,
                                     Embeddings, Scores, Transcript, MetricsText, EngineInfo)}
REPLY_OF = {Generate: Accepted, CountTokens: TokenCount, Tokenize: Tokenized, Detokenize: Detokenized,
            Embed: Embeddings, Rank: Scores, Transcribe: Transcript, Info: EngineInfo, Metrics: MetricsText,
            Ready: Verdict}
FINAL = (Done, Error)  # the events that end a generation's stream


def event_to_wire(event) -> dict:
    if isinstance(event, Verdict):
        return {"type": VERDICT, **event.to_wire()}
    to_wire = getattr(event, "to_wire", None)
    return {"type": event.type, **(to_wire() if to_wire else asdict(event))}


def event_from_wire(doc) -> Any:
    """The typed reply or event; WireError naming what is wrong."""
    kind = doc.get("type") if isinstance(doc, dict) else None
    if kind == VERDICT:
        return Verdict.from_wire(doc)
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None or kind is None:
        raise WireError(f"unknown engine event type {kind!r}")
    from_wire = getattr(cls, "from_wire", None)
    return from_wire(doc) if from_wire else _build(cls, doc, kind)
