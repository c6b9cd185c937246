"""A thinking model's reasoning apart from its answer (llama-server's `deepseek` reasoning format): the text up to
`</think>` is reasoning, what follows is the answer. Whether the answer starts inside a think block is the
engine's to say, from the rendered prompt (wire.Accepted.thinking):

- "open": the prompt ends inside one (DeepSeek-R1's template opens it): reasoning until `</think>`, and all of it
  when the answer is cut first;
- "may-open": the template thinks but left the block to the model (Qwen3): reasoning when the answer starts with
  `<think>` (after blank space), the answer otherwise;
- "": the template does not think, or the request asked for the raw text (`reasoning_format: "none"`).

Pure: fed text as the engine streams it, it holds back only what may be the start of a tag."""

from __future__ import annotations

from host_runtime.engine.stop_matcher import partial_suffix

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
MODES = ("", "open", "may-open")


def template_thinks(template: str | None) -> bool:
    """Whether a chat template knows think blocks (it writes or strips `</think>`), or has an analysis channel
    (gpt-oss's harmony, which the engine writes as a think block: engine/harmony.py)."""
    return template is not None and (CLOSE_TAG in template or "<|channel|>analysis" in template)


def prompt_thinking(template: str | None, rendered: str) -> str:
    """The mode for an answer to `rendered` (MODES)."""
    if not template_thinks(template):
        return ""
    return "open" if rendered.rfind(OPEN_TAG) > rendered.rfind(CLOSE_TAG) else "may-open"


class ReasoningSplit:
    """Streamed text -> (reasoning, answer) pieces."""

    def __init__(self, mode: str):
        self.state = {"": "answer", "open": "thinking", "may-open": "start"}[mode]
        self._held = ""
        self.reasoning_seen = mode == "open"

    def feed(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning = answer = ""
        while self._held:
            if self.state == "start":
                stripped = self._held.lstrip()
                if stripped.startswith(OPEN_TAG):
                    self._held = stripped[len(OPEN_TAG):].lstrip("\n")
                    self.state, self.reasoning_seen = "thinking", True
                    continue
                if not stripped or OPEN_TAG.startswith(stripped):
                    break  # blank space or the tag's beginning so far: not known yet
                self.state = "answer"
                continue
            if self.state == "thinking":
                end = self._held.find(CLOSE_TAG)
                if end >= 0:
                    reasoning += self._held[:end]
                    self._held = self._held[end + len(CLOSE_TAG):].lstrip("\n")
                    self.state = "after"
                    continue
                keep = partial_suffix(self._held, CLOSE_TAG)
                reasoning += self._held[:len(self._held) - keep]
                self._held = self._held[len(self._held) - keep:]
                break
            if self.state == "after":  # the blank lines after </think> belong to neither
                stripped = self._held.lstrip("\n")
                if not stripped:
                    self._held = ""
                    break
                self._held, self.state = stripped, "answer"
                continue
            answer += self._held
            self._held = ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """What was held back: a cut tag's start is text of the part it was in."""
        held, self._held = self._held, ""
        if self.state == "thinking":
            return held, ""
        return "", held if self.state in ("answer", "start") else ""


def split(text: str, mode: str) -> tuple[str | None, str]:
    """A whole answer's (reasoning, or None where it had none; the answer)."""
    splitter = ReasoningSplit(mode)
    reasoning, answer = splitter.feed(text)
    more_reasoning, more_answer = splitter.finish()
    reasoning += more_reasoning
    return (reasoning.strip("\n") if splitter.reasoning_seen else None), answer + more_answer
