"""One choice's output alone (engine/output.py, pure): the tokens' bytes into text, the stop strings, harmony's
channels; no engine, no model."""

from __future__ import annotations

import pytest

from host_runtime.engine.output import ChoiceOutput
from tests.test_harmony import ANSWER, rewrite


def _run(pieces: list[bytes], stops: list[str], harmony: bool = False) -> tuple[str, str | None]:
    out = ChoiceOutput(stops, harmony)
    sent = []
    for data in pieces:
        text, hit = out.piece(data)
        sent.append(text)
        if hit:
            return "".join(sent) + out.finish(), out.stop_string
    return "".join(sent) + out.flush() + out.finish(), None


def test_a_character_split_across_tokens_comes_whole():
    snowman = "☃".encode()
    assert _run([b"a ", snowman[:1], snowman[1:], b"!"], []) == ("a ☃!", None)
    # a character's first bytes at the end, with no rest: replaced, never lost silently
    assert _run([b"x", snowman[:2]], []) == ("x\ufffd", None)


@pytest.mark.parametrize("split_at", [1, 2, 3, 5])
def test_a_stop_string_across_tokens_ends_the_choice_unsent(split_at):
    text = b"Hello END world"
    pieces = [text[i:i + split_at] for i in range(0, len(text), split_at)]
    assert _run(pieces, ["END"]) == ("Hello ", "END")


def test_what_might_start_a_stop_string_is_text_when_the_choice_ends_otherwise():
    assert _run([b"value: EN"], ["END"]) == ("value: EN", None)


@pytest.mark.parametrize("step", [1, 4, 9])
def test_harmony_channels_are_rewritten_as_the_engine_sent_them(step):
    data = ANSWER.encode()
    pieces = [data[i:i + step] for i in range(0, len(data), step)]
    assert _run(pieces, [], harmony=True) == (rewrite(ANSWER), None)
