"""llama-server's /infill (editor autocomplete: llama.vim, llama.vscode): its request fields mapped onto a
completion with a suffix, and its answer shape ({"content", "stop", ...}, whole or as SSE lines)."""

from __future__ import annotations

import json
import time
from typing import Iterator

from host_runtime.engine import wire
from host_runtime.engine.client import QUIET
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.serving import protocol, request_models
from host_runtime.serving.errors import body_of
from host_runtime.serving.handlers import Choices, ServingLogic, engine_down
from host_runtime.serving.protocol import GenerationCall
from host_runtime.serving.sse_keepalive import KEEPALIVE_COMMENT

# llama-server's /infill fields that are the completion's own.
_KEPT = ("model", "temperature", "top_p", "seed", "stop", "stream", "input_extra", "presence_penalty",
         "frequency_penalty")


def parse_infill(body: dict, served: str) -> GenerationCall:
    request = request_models.check(request_models.InfillRequest, body)
    after = request.prompt or ""
    n_predict = -1 if request.n_predict is None else request.n_predict
    # The completion's own fields as checked (the completion parser checks them again, by its own rules)
    checked = request.model_dump(include=set(_KEPT), exclude_none=True, by_alias=True)
    completion = {"model": served, **checked,
                  "prompt": request.input_prefix or "", "suffix": request.input_suffix or "",
                  # -1 (llama-server's default) is no limit: the engine ends where the context does
                  "max_tokens": protocol.NO_LIMIT if n_predict == -1 else n_predict}
    return protocol.parse_completion(completion, served, after=after)


def _stop_type(finish: str | None) -> str:
    return {"length": "limit", "stop": "eos"}.get(finish or "stop", "eos")


def _last(model: str, content: str, finish: str | None, prompt_tokens: int, completion_tokens: int,
          started: float) -> dict:
    ms = (time.monotonic() - started) * 1000
    return {"content": content, "stop": True, "model": model, "stop_type": _stop_type(finish),
            "tokens_evaluated": prompt_tokens, "tokens_predicted": completion_tokens, "truncated": False,
            "timings": {"prompt_n": prompt_tokens, "predicted_n": completion_tokens, "predicted_ms": round(ms, 1)}}


class InfillLogic:
    def __init__(self, logic: ServingLogic):
        self.logic = logic

    def complete(self, call: GenerationCall, model: str, client_gone=None) -> dict:
        started = time.monotonic()
        stream = self.logic.open_generation(call, client_gone)
        choices = Choices(1, stream.prompt_tokens).gather(stream)
        return _last(model, choices.text[0], choices.finish[0], choices.prompt_tokens, choices.completion_tokens,
                     started)

    def stream(self, call: GenerationCall, model: str) -> Iterator[bytes]:
        """Open the generation now (so refusals are real HTTP errors), then stream llama-server's SSE lines."""
        return self._lines(self.logic.open_stream(call), model, time.monotonic())

    def _lines(self, stream, model: str, started: float) -> Iterator[bytes]:
        def line(doc: dict) -> bytes:
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        finish, completion_tokens = None, 0
        try:
            for event in stream:
                if event is QUIET:
                    yield KEEPALIVE_COMMENT
                elif isinstance(event, wire.Token):
                    yield line({"content": event.text, "stop": False})
                elif isinstance(event, wire.Finish):
                    finish, completion_tokens = event.finish_reason, event.completion_tokens
                elif isinstance(event, wire.Error):
                    yield line(body_of(event.error))
                    return
            yield line(_last(model, "", finish, stream.prompt_tokens, completion_tokens, started))
        except EngineUnavailable as exc:
            yield line(engine_down(exc).body())
        finally:
            stream.close()
