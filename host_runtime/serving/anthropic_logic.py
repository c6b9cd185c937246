"""Serving logic of the Messages API: one engine generation (the chat API's), shaped into a Message or its
event stream (message_start, content_block_start/delta/stop, message_delta, message_stop)."""

from __future__ import annotations

import json
from typing import Iterator

from host_runtime.engine import wire as engine_wire
from host_runtime.engine.client import QUIET, GenerationStream
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.serving import anthropic_protocol as wire
from host_runtime.serving.errors import anthropic_body
from host_runtime.serving.handlers import Choices, ServingLogic, call_engine, engine_down
from host_runtime.serving.protocol import GenerationCall
from host_runtime.serving.sse_keepalive import KEEPALIVE_COMMENT
from host_runtime.engine.reasoning import ReasoningSplit


def thinking_block(reasoning: str) -> dict:
    # A local model's thinking carries no signature (nothing here verifies one).
    return {"type": "thinking", "thinking": reasoning, "signature": ""}


class MessagesLogic:
    def __init__(self, logic: ServingLogic):
        self.logic = logic

    def count_tokens(self, request: engine_wire.CountTokens) -> dict:
        return {"input_tokens": call_engine(self.logic.client, request, 30.0).prompt_tokens}

    def complete(self, call: GenerationCall, model_id: str, client_gone=None) -> dict:
        stream = self.logic.open_generation(call, client_gone)
        choices = Choices(1, stream.prompt_tokens).gather(stream)
        text, finish, stop_string = choices.text[0], choices.finish[0], choices.stop_string[0]
        reasoning, content, calls = call.answer_parts(text, finish, stream.thinking)
        blocks = ([thinking_block(reasoning)] if reasoning is not None and call.show_reasoning else []) + \
            ([{"type": "text", "text": content}] if content or not calls else []) + \
            [wire.tool_use_block(c) for c in calls]
        stop_reason, stop_sequence = wire.stop_of(finish, stop_string, call, bool(calls))
        return {"id": wire.message_id(), "type": "message", "role": "assistant", "model": model_id,
                "content": blocks, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": wire.usage(choices.prompt_tokens, choices.completion_tokens, choices.cached_tokens)}

    def stream(self, call: GenerationCall, model_id: str) -> Iterator[bytes]:
        """Open the generation now (so refusals are real HTTP errors), then stream the events."""
        return self._events(self.logic.open_stream(call), call, model_id)

    def _events(self, stream: GenerationStream, call: GenerationCall, model_id: str) -> Iterator[bytes]:
        prompt_tokens = stream.prompt_tokens
        splitter = call.call_stream()
        thinking = call.thinking(stream.thinking)
        reasoner = ReasoningSplit(thinking) if thinking else None
        index = 0
        text_open = False
        thinking_open = False

        def thinking_delta(text: str) -> Iterator[bytes]:
            nonlocal thinking_open
            if not text or not call.show_reasoning:
                return
            if not thinking_open:
                thinking_open = True
                yield wire.sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "thinking", "thinking": "",
                                                                         "signature": ""}})
            yield wire.sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "thinking_delta", "thinking": text}})

        def close_thinking() -> Iterator[bytes]:
            nonlocal thinking_open, index
            if thinking_open:
                thinking_open = False
                yield wire.sse("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1

        def text_delta(text: str) -> Iterator[bytes]:
            nonlocal text_open
            if not text:
                return
            yield from close_thinking()
            if not text_open:
                text_open = True
                yield wire.sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}})
            yield wire.sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "text_delta", "text": text}})

        try:
            yield wire.sse("message_start", {"type": "message_start", "message": {
                "id": wire.message_id(), "type": "message", "role": "assistant", "model": model_id, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": wire.usage(prompt_tokens, 0, 0)}})
            yield wire.sse("ping", {"type": "ping"})
            finish, stop_string, output_tokens, calls = None, None, 0, []
            for event in stream:
                if event is QUIET:
                    yield KEEPALIVE_COMMENT
                elif isinstance(event, engine_wire.Token):
                    text = event.text
                    if reasoner:
                        reasoning, text = reasoner.feed(text)
                        yield from thinking_delta(reasoning)
                    yield from text_delta(splitter.feed(text) if splitter else text)
                elif isinstance(event, engine_wire.Finish):
                    finish, stop_string = event.finish_reason, event.stop_string
                    output_tokens = event.completion_tokens
                    if reasoner:
                        reasoning, text = reasoner.finish()
                        yield from thinking_delta(reasoning)
                        yield from text_delta(splitter.feed(text) if splitter else text)
                    yield from close_thinking()
                    if splitter:
                        rest, calls = splitter.finish(truncated=finish == "length")
                        yield from text_delta(rest)
                elif isinstance(event, engine_wire.Error):
                    yield wire.sse("error", anthropic_body(event.error))
                    return
            if not text_open and not calls:  # a Message has at least one block, if only an empty one
                text_open = True
                yield wire.sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}})
            if text_open:
                yield wire.sse("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
            for tool_call in calls:
                block = wire.tool_use_block(tool_call)
                yield wire.sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {**block, "input": {}}})
                yield wire.sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
                yield wire.sse("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
            stop_reason, stop_sequence = wire.stop_of(finish, stop_string, call, bool(calls))
            yield wire.sse("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                             "usage": {"output_tokens": output_tokens}})
            yield wire.sse("message_stop", {"type": "message_stop"})
        except EngineUnavailable as exc:
            yield wire.sse("error", anthropic_body(engine_down(exc)))
        finally:
            stream.close()
