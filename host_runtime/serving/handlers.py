"""Serving logic: drive one engine generation and shape its events into OpenAI responses."""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from typing import Iterator

from host_runtime.engine import wire
from host_runtime.engine.client import QUIET, EngineClient, GenerationStream
from host_runtime.engine.ipc import ClientGone, EngineUnavailable, MessageTooLarge
from host_runtime.serving.errors import APIError, body_of
from host_runtime.serving.protocol import EmbeddingCall, GenerationCall, RerankCall
from host_runtime.serving.sse_keepalive import KEEPALIVE_COMMENT, KEEPALIVE_S
from host_runtime.engine.reasoning import ReasoningSplit

FIRST_EVENT_TIMEOUT_S = 15.0
# Between two events of one generation; long, because a queued request sees none until it gets a slot.
IDLE_EVENT_TIMEOUT_S = 600.0


def client_left() -> APIError:
    # nginx's code for "client closed request": what the access log shows; nobody reads the body.
    return APIError(499, "the client closed the connection; the request was cancelled", code="client_closed_request")


def engine_down(exc: EngineUnavailable) -> APIError:
    if isinstance(exc, MessageTooLarge):  # the request, not the engine: refused before it was sent
        return APIError(413, f"this request is too large for the engine: {exc}", code="request_too_large")
    return APIError(503, f"the inference engine is unavailable: {exc}", error_type="server_error",
                    code="engine_unavailable", retry_after=5)


def call_engine(client: EngineClient, request, timeout: float, client_gone=None):
    """One engine call answered at once (embed, tokenize, count_tokens): its typed reply; the engine's refusal
    (RequestRejected) is answered as the API's error."""
    try:
        return client.call(request, timeout=timeout, client_gone=client_gone)
    except ClientGone:
        raise client_left() from None
    except EngineUnavailable as exc:
        raise engine_down(exc) from None


class Choices:
    """One generation's events gathered per choice (the whole answer at once: chat, completions, Messages)."""

    def __init__(self, n: int, prompt_tokens: int = 0):
        self.text = [""] * n
        self.logprobs: list[list[wire.TokenLogprob]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.stop_string: list[str | None] = [None] * n
        self.completion_tokens = 0
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0

    def absorb(self, event) -> None:
        """One event; an Error raises the engine's refusal."""
        if isinstance(event, wire.Token):
            self.text[event.index] += event.text
            if event.logprob is not None:
                self.logprobs[event.index].append(event.logprob)
        elif isinstance(event, wire.Finish):
            self.finish[event.index] = event.finish_reason
            self.stop_string[event.index] = event.stop_string
            self.completion_tokens += event.completion_tokens
        elif isinstance(event, wire.Done):
            self.cached_tokens = event.cached_tokens
        elif isinstance(event, wire.Error):
            raise event.error

    def gather(self, stream: GenerationStream) -> "Choices":
        """Every event of `stream` (closed after), the engine's failures as the API's."""
        with stream:
            try:
                for event in stream:
                    self.absorb(event)
            except ClientGone:
                raise client_left() from None
            except EngineUnavailable as exc:
                raise engine_down(exc) from None
        return self

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def chat_logprobs(entries: list[wire.TokenLogprob]) -> dict:
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
                         "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in e.top]}
                        for e in entries]}


def completion_logprobs(entries: list[wire.TokenLogprob], offset: int = 0) -> dict:
    tokens, token_logprobs, top, text_offset = [], [], [], []
    for e in entries:
        text_offset.append(offset)
        offset += len(e.token)
        tokens.append(e.token)
        token_logprobs.append(e.logprob)
        top.append({t.token: t.logprob for t in e.top})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": text_offset}


def chat_message(text: str, finish: str | None, call: GenerationCall, thinking: str = "") -> dict:
    """One choice's message and finish reason: a thinking model's reasoning apart (`reasoning_content`), and with
    tools offered, the calls the answer makes."""
    reasoning, content, calls = call.answer_parts(text, finish, thinking)
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if not calls:
        return {"message": message, "finish_reason": finish}
    return {"message": {**message, "tool_calls": [c.wire() for c in calls]},
            "finish_reason": "tool_calls" if finish == "stop" else finish}


class ServingLogic:
    def __init__(self, client: EngineClient):
        self.client = client

    def open_generation(self, call: GenerationCall, client_gone=None, quiet_s: float | None = None) -> GenerationStream:
        """Start the generation and wait for the engine to accept it (its refusal raised as the API's error).
        quiet_s: a stream's QUIET after that long without an event (SSE handlers send a comment for it)."""
        sent = time.time_ns()
        try:
            stream = self.client.generate(call.request, FIRST_EVENT_TIMEOUT_S, IDLE_EVENT_TIMEOUT_S, client_gone)
        except ClientGone:
            raise client_left() from None
        except EngineUnavailable as exc:
            raise engine_down(exc) from None
        if call.trace is not None:
            call.trace.watch(stream, sent)
        stream.quiet_s = quiet_s
        return stream

    def open_stream(self, call: GenerationCall) -> GenerationStream:
        """open_generation for a streamed answer: QUIET after KEEPALIVE_S without an event, which each SSE
        producer sends as KEEPALIVE_COMMENT."""
        return self.open_generation(call, quiet_s=KEEPALIVE_S)

    def complete(self, call: GenerationCall, kind: str, model_id: str, client_gone=None) -> dict:
        """The whole answer at once. `client_gone` is polled while waiting: a client that hangs up cancels the
        generation at the engine, as closing a stream does."""
        stream = self.open_generation(call, client_gone)
        choices = Choices(call.n, stream.prompt_tokens).gather(stream)
        created = int(time.time())
        if kind == "chat":
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": created,
                "model": model_id,
                "choices": [{"index": i, **chat_message(choices.text[i], choices.finish[i], call, stream.thinking),
                             "logprobs": chat_logprobs(choices.logprobs[i]) if call.logprobs else None}
                            for i in range(call.n)],
                "usage": choices.usage(),
            }
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": created, "model": model_id,
            "choices": [{"index": i, "text": choices.text[i],
                         "logprobs": completion_logprobs(choices.logprobs[i]) if call.logprobs else None,
                         "finish_reason": choices.finish[i]} for i in range(call.n)],
            "usage": choices.usage(),
        }

    def stream(self, call: GenerationCall, kind: str, model_id: str) -> Iterator[bytes]:
        """Open the generation now (so refusals are real HTTP errors), then stream SSE chunks.

        When the client goes away the WSGI server closes this generator; closing the
        engine stream in `finally` is what cancels the generation.
        """
        return self._sse(self.open_stream(call), call, kind, model_id)

    def _sse(self, stream: GenerationStream, call: GenerationCall, kind: str, model_id: str) -> Iterator[bytes]:
        created = int(time.time())
        is_chat = kind == "chat"
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}" if is_chat else f"cmpl-{uuid.uuid4().hex}"
        obj = "chat.completion.chunk" if is_chat else "text_completion"
        offsets = [0] * call.n
        choices = Choices(call.n, stream.prompt_tokens)

        def chunk(choice_list: list[dict], **extra) -> bytes:
            doc = {"id": chunk_id, "object": obj, "created": created, "model": model_id, "choices": choice_list, **extra}
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        splitters = [call.call_stream() for _ in range(call.n)] if is_chat and call.tools else None
        thinking = call.thinking(stream.thinking) if is_chat else ""
        reasoners = [ReasoningSplit(thinking) for _ in range(call.n)] if thinking else None
        try:
            if is_chat:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(call.n)])
            for event in stream:
                if event is QUIET:
                    yield KEEPALIVE_COMMENT
                elif isinstance(event, wire.Token):
                    i = event.index
                    lp = [event.logprob] if event.logprob is not None else []
                    text = event.text
                    if reasoners:
                        reasoning, text = reasoners[i].feed(text)
                        if reasoning:
                            yield chunk([{"index": i, "delta": {"reasoning_content": reasoning},
                                          "logprobs": chat_logprobs(lp) if call.logprobs else None,
                                          "finish_reason": None}])
                            lp = []
                        if not text:
                            continue
                    text = splitters[i].feed(text) if splitters else text
                    if is_chat:
                        if text or not splitters:  # with tools, text that may be a call is held back
                            yield chunk([{"index": i, "delta": {"content": text},
                                          "logprobs": chat_logprobs(lp) if call.logprobs else None,
                                          "finish_reason": None}])
                    else:
                        yield chunk([{"index": i, "text": event.text,
                                      "logprobs": completion_logprobs(lp, offsets[i]) if call.logprobs else None,
                                      "finish_reason": None}])
                        offsets[i] += len(event.text)
                elif isinstance(event, wire.Finish):
                    i = event.index
                    choices.completion_tokens += event.completion_tokens
                    reason = event.finish_reason
                    if reasoners:
                        reasoning, text = reasoners[i].finish()
                        if reasoning:
                            yield chunk([{"index": i, "delta": {"reasoning_content": reasoning}, "logprobs": None,
                                          "finish_reason": None}])
                        if text:
                            text = splitters[i].feed(text) if splitters else text
                            if text:
                                yield chunk([{"index": i, "delta": {"content": text}, "logprobs": None,
                                              "finish_reason": None}])
                    if splitters:
                        rest, calls = splitters[i].finish(truncated=reason == "length")
                        if rest:
                            yield chunk([{"index": i, "delta": {"content": rest}, "logprobs": None,
                                          "finish_reason": None}])
                        for k, tool_call in enumerate(calls):
                            yield chunk([{"index": i, "delta": {"tool_calls": [tool_call.wire(k)]}, "logprobs": None,
                                          "finish_reason": None}])
                        if calls and reason == "stop":
                            reason = "tool_calls"
                    if is_chat:
                        yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}])
                    else:
                        yield chunk([{"index": i, "text": "", "logprobs": None,
                                      "finish_reason": event.finish_reason}])
                elif isinstance(event, wire.Done):
                    choices.cached_tokens = event.cached_tokens
                elif isinstance(event, wire.Error):
                    yield b"data: " + json.dumps(body_of(event.error)).encode() + b"\n\n"
                    return
            if call.include_usage:
                yield chunk([], usage=choices.usage())
            yield b"data: [DONE]\n\n"
        except EngineUnavailable as exc:
            yield b"data: " + json.dumps(engine_down(exc).body()).encode() + b"\n\n"
        finally:
            stream.close()

    def rerank(self, call: RerankCall, model_id: str, client_gone=None) -> dict:
        """The documents by their score for the query, best first, the first top_n (Jina's and Cohere's shape)."""
        reply = call_engine(self.client, wire.Rank(call.query, call.documents), IDLE_EVENT_TIMEOUT_S, client_gone)
        order = sorted(range(len(reply.scores)), key=lambda i: -reply.scores[i])[:call.top_n]
        results = [{"index": i, "relevance_score": reply.scores[i],
                    **({"document": {"text": call.documents[i]}} if call.return_documents else {})} for i in order]
        return {"object": "list", "model": model_id, "results": results,
                "usage": {"prompt_tokens": reply.prompt_tokens, "total_tokens": reply.prompt_tokens}}

    def embed(self, call: EmbeddingCall, model_id: str, client_gone=None) -> dict:
        reply = call_engine(self.client, wire.Embed(call.inputs), IDLE_EVENT_TIMEOUT_S, client_gone)
        data = []
        for i, vector in enumerate(reply.data):
            if call.encoding_format == "base64":
                # What the openai client asks for by default: little-endian float32, base64.
                value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            else:
                value = vector
            data.append({"object": "embedding", "index": i, "embedding": value})
        return {"object": "list", "data": data, "model": model_id,
                "usage": {"prompt_tokens": reply.prompt_tokens, "total_tokens": reply.prompt_tokens}}
