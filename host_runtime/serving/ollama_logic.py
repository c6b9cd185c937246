"""Serving logic of Ollama's API: one engine generation (the chat API's) shaped into Ollama's answer, whole or as
NDJSON lines (a line per piece of text, then a last line with `done: true` and the counts)."""

from __future__ import annotations

import time
from typing import Iterator

from host_runtime.engine import wire
from host_runtime.engine.client import GenerationStream
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.serving import ollama_protocol as ollama
from host_runtime.serving.errors import ollama_body
from host_runtime.serving.handlers import Choices, ServingLogic, engine_down
from host_runtime.serving.protocol import GenerationCall
from host_runtime.engine.reasoning import ReasoningSplit


class OllamaLogic:
    def __init__(self, logic: ServingLogic):
        self.logic = logic

    def complete(self, call: GenerationCall, kind: str, model: str, client_gone=None) -> dict:
        """kind: "chat" (a message) or "generate" (a response string)."""
        started = time.monotonic_ns()
        stream = self.logic.open_generation(call, client_gone)
        choices = Choices(1, stream.prompt_tokens).gather(stream)
        reasoning, content, calls = call.answer_parts(choices.text[0], choices.finish[0], stream.thinking)
        thought = {"thinking": reasoning} if reasoning is not None and call.show_reasoning else {}
        answer = {"message": {"role": "assistant", "content": content, **thought,
                              **({"tool_calls": ollama.tool_calls(calls)} if calls else {})}} \
            if kind == "chat" else {"response": content, **thought}
        return ollama.final_line(model, started, choices.prompt_tokens, choices.completion_tokens,
                                 ollama.done_reason(choices.finish[0]), **answer)

    def stream(self, call: GenerationCall, kind: str, model: str) -> Iterator[bytes]:
        """Open the generation now (so refusals are real HTTP errors), then stream the lines."""
        return self._lines(self.logic.open_generation(call), call, kind, model, time.monotonic_ns())

    def _lines(self, stream: GenerationStream, call: GenerationCall, kind: str, model: str,
               started: int) -> Iterator[bytes]:
        splitter = call.call_stream() if kind == "chat" else None
        thinking = call.thinking(stream.thinking)
        reasoner = ReasoningSplit(thinking) if thinking else None

        def piece(text: str = "", calls=(), thought: str = "") -> bytes:
            extra = {"thinking": thought} if thought else {}
            if kind == "chat":
                message = {"role": "assistant", "content": text, **extra}
                if calls:
                    message["tool_calls"] = ollama.tool_calls(calls)
                return ollama.ndjson({"model": model, "created_at": ollama.now_iso(), "message": message,
                                      "done": False})
            return ollama.ndjson({"model": model, "created_at": ollama.now_iso(), "response": text, **extra,
                                  "done": False})

        def pieces(text: str) -> Iterator[bytes]:
            thought = ""
            if reasoner:
                thought, text = reasoner.feed(text)
                thought = thought if call.show_reasoning else ""
            text = splitter.feed(text) if splitter and text else text
            if text or thought:
                yield piece(text, thought=thought)

        finish, completion_tokens = None, 0
        try:
            for event in stream:
                if isinstance(event, wire.Token):
                    yield from pieces(event.text)
                elif isinstance(event, wire.Finish):
                    finish, completion_tokens = event.finish_reason, event.completion_tokens
                    if reasoner:
                        thought, text = reasoner.finish()
                        text = splitter.feed(text) if splitter and text else text
                        thought = thought if call.show_reasoning else ""
                        if text or thought:
                            yield piece(text, thought=thought)
                    if splitter:
                        rest, calls = splitter.finish(truncated=finish == "length")
                        if rest or calls:
                            yield piece(rest, calls)
                elif isinstance(event, wire.Error):
                    yield ollama.ndjson(ollama_body(event.error))
                    return
            last = {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}
            yield ollama.ndjson(ollama.final_line(model, started, stream.prompt_tokens, completion_tokens,
                                                  ollama.done_reason(finish), **last))
        except EngineUnavailable as exc:
            yield ollama.ndjson(ollama_body(engine_down(exc)))
        finally:
            stream.close()
