"""Turning an API request's prompt into tokens: the GGUF's chat template, then the tokenizer."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.tool_format import prepare, template_format, wants_argument_text
from host_runtime.engine.reasoning import prompt_thinking

# What the template is rendered with: a request's own variables may not replace these.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "eos_token", "bos_token", "raise_exception",
                                         "add_generation_prompt", "functions", "function_call", "tool_choice",
                                         "strftime_now"})


@dataclass(frozen=True)
class RenderedChat:
    tokens: list[int]
    stops: list[str]
    thinking: str  # engine/reasoning.py MODES: how the answer starts
    media: dict = field(default_factory=dict)  # an image's first place in tokens -> its projector.MediaChunk


class PromptBuilder:
    def __init__(self, model, projector=None):
        """projector: engine/projector.Projector where the model has one (serve --mmproj): images or audio
        then read."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._model = model
        self._projector = projector
        self._formatter = Jinja2ChatFormatter(
            template=model.chat_template, eos_token=model.eos_text, bos_token=model.bos_text,
            add_generation_prompt=True)

    @property
    def media(self) -> str | None:
        """What the model's projector takes (vision, audio, or vision,audio); None: text only."""
        if self._projector is None:
            return None
        return ",".join(kind for kind, takes in (("vision", self._projector.vision), ("audio", self._projector.audio))
                        if takes) or None

    @property
    def tool_format(self) -> str:
        return template_format(self._model.chat_template)

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None,
                    parallel_tool_calls: bool = True) -> tuple[list[int], list[str]]:
        """Token ids for the rendered conversation, and the template's own stop strings."""
        rendered = self.chat(messages, tools, parallel_tool_calls)
        return rendered.tokens, rendered.stops

    def chat(self, messages: list[dict], tools: list[dict] | None = None, parallel_tool_calls: bool = True,
             template_kwargs: dict | None = None, media: list[str] | None = None) -> RenderedChat:
        """The conversation rendered with the template (and the request's own template variables), tokenized;
        with images or sounds (base64, one per wire.MEDIA_MARKER in the messages), through the model's
        projector."""
        messages, tools = prepare(messages, self.tool_format, tools, parallel_tool_calls,
                                  wants_argument_text(self._model.chat_template))
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise RequestRejected(400, "'chat_template_kwargs' must be an object", param="chat_template_kwargs")
        extra = dict(template_kwargs or {})
        if clash := sorted(RESERVED_TEMPLATE_VARIABLES & set(extra)):
            raise RequestRejected(400, f"'chat_template_kwargs' may not set {', '.join(clash)}",
                                  param="chat_template_kwargs")
        try:
            rendered = self._formatter(messages=messages, tools=tools, **extra)
        except Exception as exc:  # jinja raises its own types, and templates call raise_exception()
            raise RequestRejected(400, f"the model's chat template refused these messages: {exc}",
                                  param="messages") from None
        stops = rendered.stop if isinstance(rendered.stop, list) else ([rendered.stop] if rendered.stop else [])
        thinking = prompt_thinking(self._model.chat_template, rendered.prompt)
        if media:
            placed = self._with_media(rendered.prompt, media)
            return RenderedChat(placed.tokens, stops, thinking, placed.media)
        tokens = self._model.tokenize(rendered.prompt, add_bos=self._model.add_bos(), special=True)
        return RenderedChat(tokens, stops, thinking)

    def _with_media(self, prompt: str, media: list[str]):
        if self._projector is None:
            raise RequestRejected(400, "this model reads no images or audio: it is served without a projector (serve "
                                  "--mmproj PATH, or models add --mmproj: the projector GGUF made for it)",
                                  param="messages", code="model_not_multimodal")
        decoded = []
        for i, text in enumerate(media):
            try:
                decoded.append(base64.b64decode(text, validate=True))
            except (binascii.Error, ValueError):
                raise RequestRejected(400, f"item {i + 1} of the request's media is not valid base64",
                                      param="messages", code="invalid_image") from None
        return self._projector.tokenize(prompt, decoded)

    def completion_tokens(self, prompt: str) -> list[int]:
        # Prompts from /v1/completions are plain text: special-token markup is not parsed.
        return self._model.tokenize(prompt, add_bos=self._model.add_bos(), special=False) if prompt else []

    def infill_tokens(self, prefix: str, suffix: str, extra: list[dict] = (), after: str = "") -> list[int]:
        """Fill in the middle, as llama-server's /infill lays it out: other files (each after the separator
        token, where the vocabulary has one), then <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID> and `after`. The
        texts are tokenized as plain text: markup in them is not parsed as special tokens."""
        fim = self._model.fim_tokens()
        missing = [name for name in ("pre", "suf", "mid") if name not in fim]
        if missing:
            raise RequestRejected(400, "this model has no fill-in-the-middle tokens (its GGUF names no "
                                  f"{', '.join('FIM_' + m.upper() for m in missing)}): use a code model trained for "
                                  "infill, or send the text as a prompt without 'suffix'", param="suffix",
                                  code="model_not_infill")

        def text(value: str) -> list[int]:
            return self._model.tokenize(value, add_bos=False, special=False) if value else []

        tokens = [self._model.model.token_bos()] if self._model.add_bos() else []
        if "sep" in fim:
            if "rep" in fim:
                tokens += [fim["rep"]] + text("project\n")
            for chunk in extra:
                tokens += [fim["sep"]] + text(f"{chunk.get('filename', '')}\n{chunk.get('text', '')}")
            if extra:
                tokens += [fim["sep"]]
        return tokens + [fim["pre"]] + text(prefix) + [fim["suf"]] + text(suffix) + [fim["mid"]] + text(after)
