"""Turning an API request's prompt into tokens: the GGUF's chat template, then the tokenizer."""

from __future__ import annotations

from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.tool_format import prepare, template_format


class PromptBuilder:
    def __init__(self, model):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._model = model
        self._formatter = Jinja2ChatFormatter(
            template=model.chat_template, eos_token=model.eos_text, bos_token=model.bos_text,
            add_generation_prompt=True)

    @property
    def tool_format(self) -> str:
        return template_format(self._model.chat_template)

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None,
                    parallel_tool_calls: bool = True) -> tuple[list[int], list[str]]:
        """Token ids for the rendered conversation, and the template's own stop strings."""
        messages, tools = prepare(messages, self.tool_format, tools, parallel_tool_calls)
        try:
            rendered = self._formatter(messages=messages, tools=tools)
        except Exception as exc:  # jinja raises its own types, and templates call raise_exception()
            raise RequestRejected(400, f"the model's chat template refused these messages: {exc}",
                                  param="messages") from None
        tokens = self._model.tokenize(rendered.prompt, add_bos=self._model.add_bos(), special=True)
        stops = rendered.stop if isinstance(rendered.stop, list) else ([rendered.stop] if rendered.stop else [])
        return tokens, stops

    def completion_tokens(self, prompt: str) -> list[int]:
        # Prompts from /v1/completions are plain text: special-token markup is not parsed.
        return self._model.tokenize(prompt, add_bos=self._model.add_bos(), special=False) if prompt else []
