"""gpt-oss's harmony format, rewritten as it streams into the shapes the API's readers already know (pure).

A harmony answer is a run of messages, each a header and a body:
    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>final<|message|>ANSWER                        (then <|return|>, which ends it)
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}   (then <|call|>)
(the recipient may also stand before the channel: `<|start|>assistant to=functions.NAME<|channel|>commentary json`).
llama.cpp renders <|channel|>, <|message|>, <|start|>, <|constrain|> and <|end|> as text for this vocabulary and ends
the generation at <|return|> and <|call|>. Rewritten: the analysis channel as a `<think>` block
(engine/reasoning.py takes it apart as reasoning), the final channel and a commentary message to no one (a
preamble) as the answer's text, and a call to a function as a Hermes call, `<tool_call>{"name": NAME, "arguments":
ARGS}</tool_call>` (serving/tool_calls.py reads it back; a call's arguments run to the generation's end, <|call|>,
whatever text they hold). Text that does not start as harmony (an answer a grammar
shaped from its first token, a response_format's JSON) passes through unchanged.
"""

from __future__ import annotations

import json
import re

from host_runtime.engine.stop_matcher import partial_suffix

CHANNEL, MESSAGE, START, END, CONSTRAIN = "<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"(\w+)")


class HarmonyText:
    """feed() the answer's text as it comes, send what it returns; finish() once at the end."""

    def __init__(self):
        # first (not yet known to be harmony), header, body, between (after a message), plain (not harmony)
        self._state = "first"
        self._held = ""
        self._closing = ""      # what ends the current body's rewriting (</think>, }</tool_call>, or nothing)
        self._to_function = False  # the current body is a call's arguments (they may hold any text)

    def feed(self, text: str) -> str:
        self._held += text
        out = []
        while self._held:
            state = self._state
            if state == "plain":
                out.append(self._held)
                self._held = ""
            elif state in ("first", "between"):
                # The answer's start, or what follows a message: a header (after <|start|>), or text that is not
                # harmony at all (from the start: all of it, as it is).
                if self._held.startswith(START):
                    self._held = self._held[len(START):]
                    self._state = "header"
                elif self._held.startswith(CHANNEL):
                    self._state = "header"
                elif START.startswith(self._held) or CHANNEL.startswith(self._held):
                    break  # a marker's beginning so far
                else:
                    self._state = "plain"
            elif state == "header":
                at = self._held.find(MESSAGE)
                if at < 0:
                    break
                out.append(self._open(self._held[:at]))
                self._held = self._held[at + len(MESSAGE):]
                self._state = "body"
            elif self._to_function:  # a call's arguments run to <|call|>, which ends the generation: all of it
                out.append(self._held)
                self._held = ""
            else:  # body: up to <|end|>, or a <|start|> the model wrote without one
                ends = [(i, m) for m in (END, START) if (i := self._held.find(m)) >= 0]
                if not ends:
                    keep = max(partial_suffix(self._held, END), partial_suffix(self._held, START))
                    out.append(self._held[:len(self._held) - keep])
                    self._held = self._held[len(self._held) - keep:]
                    break
                at, marker = min(ends)
                out += [self._held[:at], self._closing]
                self._closing = ""
                self._held = self._held[at + (len(END) if marker == END else 0):]
                self._state = "between"
        return "".join(out)

    def finish(self) -> str:
        """What was held (a cut marker's start is the text it was in), and the current message's end."""
        held, self._held = self._held, ""
        if self._state in ("first", "plain", "between"):
            return held
        if self._state == "header":
            return ""  # a header the answer was cut in: nothing of it is text
        closing, self._closing = self._closing, ""
        return (held if self._state == "body" else "") + closing

    def _open(self, header: str) -> str:
        """A message's start, from its header: what to write before its body (and remember what closes it)."""
        channel = m.group(1) if (m := _CHANNEL_NAME.search(header)) else "final"
        recipient = _RECIPIENT.search(header)
        self._to_function = recipient is not None
        if recipient:
            self._closing = "}</tool_call>"
            return f'<tool_call>{{"name": {json.dumps(recipient.group(1))}, "arguments": '
        if channel == "analysis":
            self._closing = "</think>"
            return "<think>"
        self._closing = ""
        return ""
