"""Serving logic of the Responses API: one engine generation (the chat API's) shaped into a Response, whole or as
its event stream (response.created, response.in_progress, then per output item output_item.added, its deltas and
output_item.done, then response.completed)."""

from __future__ import annotations

import json
from typing import Iterator

from host_runtime.engine import wire
from host_runtime.engine.client import QUIET, GenerationStream
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.serving import responses_protocol as shape
from host_runtime.serving.errors import body_of
from host_runtime.serving.handlers import Choices, ServingLogic, engine_down
from host_runtime.serving.protocol import GenerationCall
from host_runtime.serving.sse_keepalive import KEEPALIVE_COMMENT
from host_runtime.engine.reasoning import ReasoningSplit


def _status(finish: str | None) -> tuple[str, str | None]:
    return ("incomplete", "max_output_tokens") if finish == "length" else ("completed", None)


class ResponsesLogic:
    def __init__(self, logic: ServingLogic):
        self.logic = logic

    def complete(self, call: GenerationCall, body: dict, model: str, client_gone=None) -> dict:
        stream = self.logic.open_generation(call, client_gone)
        choices = Choices(1, stream.prompt_tokens).gather(stream)
        finish = choices.finish[0]
        reasoning, text, calls = call.answer_parts(choices.text[0], finish, stream.thinking)
        text = text or ""
        output = ([shape.reasoning_item(shape.new_id("rs"), reasoning)] if reasoning is not None else []) + \
            ([shape.message_item(shape.new_id("msg"), text)] if text or not calls else []) + \
            [shape.function_call_item(c) for c in calls]
        status, incomplete = _status(finish)
        return shape.response(body, model, shape.new_id("resp"), shape.now(), output, status,
                              shape.usage(choices.prompt_tokens, choices.completion_tokens, choices.cached_tokens),
                              incomplete)

    def stream(self, call: GenerationCall, body: dict, model: str) -> Iterator[bytes]:
        """Open the generation now (so refusals are real HTTP errors), then stream the events."""
        return self._events(self.logic.open_stream(call), call, body, model)

    def _events(self, stream: GenerationStream, call: GenerationCall, body: dict, model: str) -> Iterator[bytes]:
        response_id, created = shape.new_id("resp"), shape.now()
        sequence = 0
        output: list[dict] = []
        text_item: dict | None = None  # the message item being written, while it is open
        text = ""

        def event(kind: str, **fields) -> bytes:
            nonlocal sequence
            sequence += 1
            data = {"type": kind, "sequence_number": sequence - 1, **fields}
            return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

        reasoning_item: dict | None = None  # the reasoning item being written, while it is open
        reasoning = ""

        def reasoning_delta(piece: str) -> Iterator[bytes]:
            nonlocal reasoning_item, reasoning
            if not piece:
                return
            if reasoning_item is None:
                reasoning_item = shape.reasoning_item(shape.new_id("rs"), "", status="in_progress")
                yield event("response.output_item.added", output_index=len(output), item=reasoning_item)
            reasoning += piece
            yield event("response.reasoning_text.delta", item_id=reasoning_item["id"], output_index=len(output),
                        content_index=0, delta=piece)

        def close_reasoning() -> Iterator[bytes]:
            nonlocal reasoning_item
            if reasoning_item is None:
                return
            item = shape.reasoning_item(reasoning_item["id"], reasoning.strip("\n"))
            yield event("response.reasoning_text.done", item_id=item["id"], output_index=len(output),
                        content_index=0, text=item["content"][0]["text"])
            yield event("response.output_item.done", output_index=len(output), item=item)
            output.append(item)
            reasoning_item = None

        def text_delta(piece: str) -> Iterator[bytes]:
            nonlocal text_item, text
            if not piece:
                return
            yield from close_reasoning()
            if text_item is None:
                text_item = shape.message_item(shape.new_id("msg"), "", status="in_progress")
                yield event("response.output_item.added", output_index=len(output), item=text_item)
                yield event("response.content_part.added", item_id=text_item["id"], output_index=len(output),
                            content_index=0, part=shape.output_text(""))
            text += piece
            yield event("response.output_text.delta", item_id=text_item["id"], output_index=len(output),
                        content_index=0, delta=piece, logprobs=[])

        def close_text() -> Iterator[bytes]:
            nonlocal text_item
            if text_item is None:
                return
            item = shape.message_item(text_item["id"], text)
            yield event("response.output_text.done", item_id=item["id"], output_index=len(output), content_index=0,
                        text=text, logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=len(output), content_index=0,
                        part=shape.output_text(text))
            yield event("response.output_item.done", output_index=len(output), item=item)
            output.append(item)
            text_item = None

        splitter = call.call_stream()
        thinking = call.thinking(stream.thinking)
        reasoner = ReasoningSplit(thinking) if thinking else None
        try:
            start = shape.response(body, model, response_id, created, [], "in_progress", None)
            yield event("response.created", response=start)
            yield event("response.in_progress", response=start)
            finish, calls, usage, completion_tokens = None, [], None, 0
            for ev in stream:
                if ev is QUIET:
                    yield KEEPALIVE_COMMENT
                elif isinstance(ev, wire.Token):
                    piece = ev.text
                    if reasoner:
                        thought, piece = reasoner.feed(piece)
                        yield from reasoning_delta(thought)
                    yield from text_delta(splitter.feed(piece) if splitter else piece)
                elif isinstance(ev, wire.Finish):
                    finish, completion_tokens = ev.finish_reason, ev.completion_tokens
                    if reasoner:
                        thought, piece = reasoner.finish()
                        yield from reasoning_delta(thought)
                        yield from text_delta(splitter.feed(piece) if splitter else piece)
                    yield from close_reasoning()
                    if splitter:
                        rest, calls = splitter.finish(truncated=finish == "length")
                        yield from text_delta(rest)
                elif isinstance(ev, wire.Done):
                    usage = shape.usage(ev.prompt_tokens, completion_tokens, ev.cached_tokens)
                elif isinstance(ev, wire.Error):
                    yield event("error", **body_of(ev.error)["error"])
                    return
            if not calls and text_item is None:  # an empty answer is still one message
                item = shape.message_item(shape.new_id("msg"), "")
                yield event("response.output_item.added", output_index=len(output),
                            item={**item, "status": "in_progress", "content": []})
                yield event("response.output_item.done", output_index=len(output), item=item)
                output.append(item)
            yield from close_text()
            for tool_call in calls:
                item = shape.function_call_item(tool_call)
                yield event("response.output_item.added", output_index=len(output),
                            item={**item, "arguments": "", "status": "in_progress"})
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=len(output),
                            delta=item["arguments"])
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=len(output),
                            arguments=item["arguments"])
                yield event("response.output_item.done", output_index=len(output), item=item)
                output.append(item)
            status, incomplete = _status(finish)
            final = shape.response(body, model, response_id, created, output, status, usage, incomplete)
            yield event("response.completed" if status == "completed" else "response.incomplete", response=final)
        except EngineUnavailable as exc:
            yield event("error", **body_of(engine_down(exc))["error"])
        finally:
            stream.close()
