"""Serving logic of the Messages API: one engine generation (the chat API's), shaped into a Message or its
event stream (message_start, content_block_start/delta/stop, message_delta, message_stop)."""

from __future__ import annotations

import json
from typing import Iterator

from host_runtime.engine.ipc import ClientGone, EngineUnavailable, EventStream
from host_runtime.serving import anthropic_protocol as wire
from host_runtime.serving.errors import APIError
from host_runtime.serving.handlers import ServingLogic, call_engine, client_left, engine_down
from host_runtime.serving.protocol import GenerationCall
from host_runtime.serving.tool_calls import ToolCallStream, parse_output


class MessagesLogic:
    def __init__(self, logic: ServingLogic):
        self.logic = logic

    def count_tokens(self, message: dict) -> dict:
        return {"input_tokens": call_engine(self.logic.client, message, 30.0)["prompt_tokens"]}

    def complete(self, call: GenerationCall, model_id: str, client_gone=None) -> dict:
        stream, prompt_tokens = self.logic._open(call, client_gone)
        text, finish, stop_string, output_tokens, cached = "", None, None, 0, 0
        with stream:
            try:
                for event in stream:
                    kind = event["type"]
                    if kind == "token":
                        text += event["text"]
                    elif kind == "finish":
                        finish, stop_string = event["finish_reason"], event.get("stop_string")
                        output_tokens = event["completion_tokens"]
                    elif kind == "done":
                        cached = int(event.get("cached_tokens", 0))
                    elif kind == "error":
                        raise APIError.from_engine(event["error"])
            except ClientGone:
                raise client_left() from None
            except EngineUnavailable as exc:
                raise engine_down(exc) from None
        tools = call.extra.get("tools")
        content, calls = parse_output(text, tools, truncated=finish == "length") if tools else (text, [])
        if not call.extra["tool_choice"].parallel:
            calls = calls[:1]
        if not calls:
            content = text
        blocks = ([{"type": "text", "text": content}] if content or not calls else []) + \
            [wire.tool_use_block(c) for c in calls]
        stop_reason, stop_sequence = wire.stop_of(finish, stop_string, call, bool(calls))
        return {"id": wire.message_id(), "type": "message", "role": "assistant", "model": model_id,
                "content": blocks, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": wire.usage(prompt_tokens, output_tokens, cached)}

    def stream(self, call: GenerationCall, model_id: str) -> Iterator[bytes]:
        """Open the generation now (so refusals are real HTTP errors), then stream the events."""
        stream, prompt_tokens = self.logic._open(call)
        return self._events(stream, prompt_tokens, call, model_id)

    def _events(self, stream: EventStream, prompt_tokens: int, call: GenerationCall,
                model_id: str) -> Iterator[bytes]:
        tools = call.extra.get("tools")
        splitter = ToolCallStream(tools) if tools else None
        index = 0
        text_open = False

        def text_delta(text: str) -> Iterator[bytes]:
            nonlocal text_open
            if not text:
                return
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
                kind = event["type"]
                if kind == "token":
                    yield from text_delta(splitter.feed(event["text"]) if splitter else event["text"])
                elif kind == "finish":
                    finish, stop_string = event["finish_reason"], event.get("stop_string")
                    output_tokens = event["completion_tokens"]
                    if splitter:
                        rest, calls = splitter.finish(truncated=finish == "length")
                        calls = calls if call.extra["tool_choice"].parallel else calls[:1]
                        yield from text_delta(rest)
                elif kind == "error":
                    err = APIError.from_engine(event["error"])
                    yield wire.sse("error", wire.error_body(err))
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
            yield wire.sse("error", wire.error_body(engine_down(exc)))
        finally:
            stream.close()
