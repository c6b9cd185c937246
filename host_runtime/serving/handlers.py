"""Serving logic: drive one engine generation and shape its events into OpenAI responses."""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from typing import Iterator

from host_runtime.engine.ipc import ClientGone, EngineClient, EngineUnavailable, EventStream, MessageTooLarge
from host_runtime.serving.errors import APIError
from host_runtime.serving.protocol import EmbeddingCall, GenerationCall
from host_runtime.serving.tool_calls import ToolCallStream, parse_output

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


def call_engine(client: EngineClient, message: dict, timeout: float, client_gone=None) -> dict:
    """One engine call answered at once (embed, tokenize, count_tokens): its errors as the API's."""
    try:
        reply = client.call(message, timeout=timeout, client_gone=client_gone)
    except ClientGone:
        raise client_left() from None
    except EngineUnavailable as exc:
        raise engine_down(exc) from None
    if reply.get("type") == "error":
        raise APIError.from_engine(reply["error"])
    return reply


class _Choices:
    """Accumulates one generation's events per choice."""

    def __init__(self, n: int):
        self.text = [""] * n
        self.logprobs: list[list[dict]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def chat_logprobs(entries: list[dict]) -> dict:
    return {"content": [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
                         "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                                          for t in e["top"]]} for e in entries]}


def completion_logprobs(entries: list[dict], offset: int = 0) -> dict:
    tokens, token_logprobs, top, text_offset = [], [], [], []
    for e in entries:
        text_offset.append(offset)
        offset += len(e["token"])
        tokens.append(e["token"])
        token_logprobs.append(e["logprob"])
        top.append({t["token"]: t["logprob"] for t in e["top"]})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": text_offset}


def chat_message(text: str, finish: str | None, call: GenerationCall) -> dict:
    """One choice's message and finish reason; with tools offered, the calls the answer makes."""
    tools = call.extra.get("tools")
    if not tools:
        return {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
    content, calls = parse_output(text, tools, truncated=finish == "length")
    if not call.extra["tool_choice"].parallel:
        calls = calls[:1]
    if not calls:
        return {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
    return {"message": {"role": "assistant", "content": content, "tool_calls": [c.wire() for c in calls]},
            "finish_reason": "tool_calls" if finish == "stop" else finish}


class ServingLogic:
    def __init__(self, client: EngineClient):
        self.client = client

    def _open(self, call: GenerationCall, client_gone=None) -> tuple[EventStream, int]:
        """Start the generation and wait for the engine to accept or refuse it."""
        try:
            stream = self.client.stream(call.engine_message, FIRST_EVENT_TIMEOUT_S, IDLE_EVENT_TIMEOUT_S,
                                        client_gone)
        except EngineUnavailable as exc:
            raise engine_down(exc) from None
        try:
            first = stream.next_event()
        except ClientGone:
            raise client_left() from None
        except EngineUnavailable as exc:
            stream.close()
            raise engine_down(exc) from None
        if first["type"] == "error":
            stream.close()
            raise APIError.from_engine(first["error"])
        return stream, int(first.get("prompt_tokens", 0))

    def complete(self, call: GenerationCall, kind: str, model_id: str, client_gone=None) -> dict:
        """The whole answer at once. `client_gone` is polled while waiting: a client that hangs up cancels the
        generation at the engine, as closing a stream does."""
        stream, prompt_tokens = self._open(call, client_gone)
        choices = _Choices(call.n)
        choices.prompt_tokens = prompt_tokens
        with stream:
            try:
                for event in stream:
                    self._absorb(choices, event)
            except ClientGone:
                raise client_left() from None
            except EngineUnavailable as exc:
                raise engine_down(exc) from None
        created = int(time.time())
        if kind == "chat":
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": created,
                "model": model_id,
                "choices": [{"index": i, **chat_message(choices.text[i], choices.finish[i], call),
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

    @staticmethod
    def _absorb(choices: _Choices, event: dict) -> None:
        kind = event["type"]
        if kind == "token":
            choices.text[event["index"]] += event["text"]
            if event.get("logprob"):
                choices.logprobs[event["index"]].append(event["logprob"])
        elif kind == "finish":
            choices.finish[event["index"]] = event["finish_reason"]
            choices.completion_tokens += event["completion_tokens"]
        elif kind == "done":
            choices.cached_tokens = int(event.get("cached_tokens", 0))
        elif kind == "error":
            raise APIError.from_engine(event["error"])

    def stream(self, call: GenerationCall, kind: str, model_id: str) -> Iterator[bytes]:
        """Open the generation now (so refusals are real HTTP errors), then stream SSE chunks.

        When the client goes away the WSGI server closes this generator; closing the
        engine stream in `finally` is what cancels the generation.
        """
        stream, prompt_tokens = self._open(call)
        return self._sse(stream, prompt_tokens, call, kind, model_id)

    def _sse(self, stream: EventStream, prompt_tokens: int, call: GenerationCall, kind: str,
             model_id: str) -> Iterator[bytes]:
        created = int(time.time())
        is_chat = kind == "chat"
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}" if is_chat else f"cmpl-{uuid.uuid4().hex}"
        obj = "chat.completion.chunk" if is_chat else "text_completion"
        offsets = [0] * call.n
        choices = _Choices(call.n)
        choices.prompt_tokens = prompt_tokens

        def chunk(choice_list: list[dict], **extra) -> bytes:
            doc = {"id": chunk_id, "object": obj, "created": created, "model": model_id, "choices": choice_list, **extra}
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        tools = call.extra.get("tools") if is_chat else None
        splitters = [ToolCallStream(tools) for _ in range(call.n)] if tools else None
        try:
            if is_chat:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for i in range(call.n)])
            for event in stream:
                kind_ = event["type"]
                if kind_ == "token":
                    i = event["index"]
                    lp = [event["logprob"]] if event.get("logprob") else []
                    text = splitters[i].feed(event["text"]) if splitters else event["text"]
                    if is_chat:
                        if text or not splitters:  # with tools, text that may be a call is held back
                            yield chunk([{"index": i, "delta": {"content": text},
                                          "logprobs": chat_logprobs(lp) if call.logprobs else None,
                                          "finish_reason": None}])
                    else:
                        yield chunk([{"index": i, "text": event["text"],
                                      "logprobs": completion_logprobs(lp, offsets[i]) if call.logprobs else None,
                                      "finish_reason": None}])
                        offsets[i] += len(event["text"])
                elif kind_ == "finish":
                    i = event["index"]
                    choices.completion_tokens += event["completion_tokens"]
                    reason = event["finish_reason"]
                    if splitters:
                        rest, calls = splitters[i].finish(truncated=reason == "length")
                        calls = calls if call.extra["tool_choice"].parallel else calls[:1]
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
                                      "finish_reason": event["finish_reason"]}])
                elif kind_ == "done":
                    choices.cached_tokens = int(event.get("cached_tokens", 0))
                elif kind_ == "error":
                    yield b"data: " + json.dumps(APIError.from_engine(event["error"]).body()).encode() + b"\n\n"
                    return
            if call.include_usage:
                yield chunk([], usage=choices.usage())
            yield b"data: [DONE]\n\n"
        except EngineUnavailable as exc:
            yield b"data: " + json.dumps(engine_down(exc).body()).encode() + b"\n\n"
        finally:
            stream.close()

    def embed(self, call: EmbeddingCall, model_id: str, client_gone=None) -> dict:
        reply = call_engine(self.client, {"op": "embed", "inputs": call.inputs}, IDLE_EVENT_TIMEOUT_S, client_gone)
        data = []
        for i, vector in enumerate(reply["data"]):
            if call.encoding_format == "base64":
                # What the openai client asks for by default: little-endian float32, base64.
                value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            else:
                value = vector
            data.append({"object": "embedding", "index": i, "embedding": value})
        return {"object": "list", "data": data, "model": model_id,
                "usage": {"prompt_tokens": reply["prompt_tokens"], "total_tokens": reply["prompt_tokens"]}}
