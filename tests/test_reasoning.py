"""A thinking model's reasoning apart from its answer: the splitter alone (any chunking gives the same parts), then
real servers with tiny random-weight GGUFs carrying DeepSeek-R1's and Qwen3's own chat templates
(tests/templates, from llama.cpp's repository)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from host_runtime.engine.reasoning import ReasoningSplit, prompt_thinking, split, template_thinks
from tests.servers import Proc, everycycle, free_port, ready, wait_for
from tests.tiny_gguf import write_tiny_llama

TEMPLATES = Path(__file__).parent / "templates"
R1 = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()

CASES = [
    # (mode, generated text, reasoning, answer)
    ("open", "Let me think.\nIt is 4.\n</think>\n\nThe answer is 4.", "Let me think.\nIt is 4.", "The answer is 4."),
    ("open", "cut off while thinking", "cut off while thinking", ""),
    ("may-open", "<think>\nhmm</think>\n\nYes.", "hmm", "Yes."),
    ("may-open", "\n<think>a < b, so</think>No.", "a < b, so", "No."),
    ("may-open", "<html> is a tag", None, "<html> is a tag"),
    ("may-open", "Plain answer, no thinking.", None, "Plain answer, no thinking."),
    ("may-open", "<thi", None, "<thi"),                       # cut inside what might have been the tag
    ("open", "almost done </thi", "almost done </thi", ""),   # cut inside the closing tag: still reasoning
    ("", "<think>raw</think>kept as it is", None, "<think>raw</think>kept as it is"),
]


@pytest.mark.parametrize("mode,text,reasoning,answer", CASES)
def test_the_split_is_the_same_whole_and_fed_in_any_pieces(mode, text, reasoning, answer):
    assert split(text, mode) == (reasoning, answer)
    for size in (1, 2, 3, 7):
        splitter = ReasoningSplit(mode)
        got_reasoning = got_answer = ""
        for start in range(0, len(text), size):
            r, a = splitter.feed(text[start:start + size])
            got_reasoning, got_answer = got_reasoning + r, got_answer + a
        r, a = splitter.finish()
        assert (got_reasoning + r).strip("\n") == (reasoning or "") and got_answer + a == answer, size


def test_which_templates_think_and_how_their_prompts_start_the_answer():
    assert template_thinks(R1) and template_thinks(QWEN3) and not template_thinks("{{ messages }}")
    assert prompt_thinking(R1, "<｜User｜>hi<｜Assistant｜><think>\n") == "open"
    assert prompt_thinking(QWEN3, "<|im_start|>assistant\n") == "may-open"
    assert prompt_thinking(QWEN3, "<|im_start|>assistant\n<think>\n\n</think>\n\n") == "may-open"
    assert prompt_thinking("{{ messages }}", "<think>") == ""


def _serve(d: Path, template: str, name: str):
    model = write_tiny_llama(d / f"{name}.gguf", n_ctx=1024, chat_template=template)
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--model", str(model), "--threads", "2", "--workers", "1",
                           "--parallel", "2", "--ctx-size", "512", "--run-dir", str(d / name)), d / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: ready(base), 60, f"the {name} server", proc)
    return proc, openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


ASK = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.mark.system
def test_an_r1_templates_answer_is_reasoning_until_it_closes_streamed_or_not(tmp_path):
    # R1's generation prompt opens a think block; a random model never closes it, so all it says is reasoning,
    # exactly the text it gives with reasoning_format "none".
    proc, client = _serve(tmp_path, R1, "tiny-r1")
    try:
        raw = client.chat.completions.create(model="tiny-r1", messages=ASK, max_tokens=24, temperature=0,
                                             extra_body={"reasoning_format": "none"}).choices[0]
        apart = client.chat.completions.create(model="tiny-r1", messages=ASK, max_tokens=24, temperature=0).choices[0]
        assert raw.message.content and not getattr(raw.message, "reasoning_content", None)
        assert apart.message.reasoning_content == raw.message.content.strip("\n")
        assert apart.message.content == "" and apart.finish_reason == "length"
        reasoning = content = ""
        for chunk in client.chat.completions.create(model="tiny-r1", messages=ASK, max_tokens=24, temperature=0,
                                                    stream=True):
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning += getattr(delta, "reasoning_content", None) or ""
                content += delta.content or ""
        assert reasoning.strip("\n") == apart.message.reasoning_content and content == ""
        # A grammar shapes the answer from its first token: all of it is the answer, none reasoning.
        shaped = client.chat.completions.create(model="tiny-r1", messages=ASK, max_tokens=40, temperature=0,
                                                response_format={"type": "json_object"}).choices[0]
        assert shaped.message.content and getattr(shaped.message, "reasoning_content", None) is None

        # The Messages API: thinking blocks when asked for (whole and streamed), left out otherwise.
        import anthropic

        messages = anthropic.Anthropic(base_url=str(client.base_url).removesuffix("/v1/"), api_key="unused",
                                       max_retries=0).messages
        asked = dict(model="tiny-r1", max_tokens=24, messages=ASK, extra_body={"temperature": 0})
        thought = messages.create(**asked, thinking={"type": "enabled", "budget_tokens": 1024})
        assert [b.type for b in thought.content] == ["thinking", "text"]
        assert thought.content[0].thinking == apart.message.reasoning_content and thought.content[1].text == ""
        with messages.stream(**asked, thinking={"type": "enabled", "budget_tokens": 1024}) as events:
            final = events.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].thinking.strip("\n") == apart.message.reasoning_content
        unasked = messages.create(**asked)
        assert [(b.type, b.text) for b in unasked.content] == [("text", "")]

        # The Responses API: a reasoning item before the (empty) message, whole and streamed.
        said = client.responses.create(model="tiny-r1", input="What is 2 + 2?", max_output_tokens=24, temperature=0)
        assert [item.type for item in said.output] == ["reasoning", "message"]
        assert said.output[0].content[0].text == apart.message.reasoning_content
        streamed = [e for e in client.responses.create(model="tiny-r1", input="What is 2 + 2?", max_output_tokens=24,
                                                       temperature=0, stream=True)]
        deltas = "".join(e.delta for e in streamed if e.type == "response.reasoning_text.delta")
        assert deltas.strip("\n") == apart.message.reasoning_content
        done = [e.item for e in streamed if e.type == "response.output_item.done"]
        assert [i.type for i in done] == ["reasoning", "message"]

        # Ollama's API: `thinking` beside the content, whole and streamed; not with think false.
        import ollama

        box = ollama.Client(host=str(client.base_url).removesuffix("/v1/"))
        options = {"temperature": 0, "num_predict": 24}
        whole = box.chat(model="tiny-r1", messages=ASK, options=options, think=True)
        assert whole.message.thinking == apart.message.reasoning_content and whole.message.content == ""
        parts = list(box.chat(model="tiny-r1", messages=ASK, options=options, think=True, stream=True))
        assert "".join(p.message.thinking or "" for p in parts).strip("\n") == apart.message.reasoning_content
        assert not box.chat(model="tiny-r1", messages=ASK, options=options, think=False).message.thinking
    finally:
        proc.stop()


@pytest.mark.system
def test_chat_template_kwargs_reach_qwen3s_template(tmp_path):
    # enable_thinking: false makes Qwen3's template write an empty think block into the prompt (its 21 bytes
    # are 21 tokens of this byte-level vocabulary); a key the template's renderer owns is refused.
    proc, client = _serve(tmp_path, QWEN3, "tiny-qwen3")
    try:
        plain = client.chat.completions.create(model="tiny-qwen3", messages=ASK, max_tokens=4, temperature=0)
        closed = client.chat.completions.create(model="tiny-qwen3", messages=ASK, max_tokens=4, temperature=0,
                                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert closed.usage.prompt_tokens - plain.usage.prompt_tokens == len("<think>\n\n</think>\n\n")
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny-qwen3", messages=ASK, max_tokens=4,
                                           extra_body={"chat_template_kwargs": {"messages": []}})
        assert "may not set messages" in err.value.message
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny-qwen3", messages=ASK, max_tokens=4, reasoning_effort="max")
        assert err.value.body["param"] == "reasoning_effort"
    finally:
        proc.stop()
