"""gpt-oss's harmony format (pure): the engine's rewriting of its channels, and what the API's readers make of it;
the format chosen from gpt-oss's own template (tests/templates, from llama.cpp), rendered as the engine renders it."""

from __future__ import annotations

from pathlib import Path

import pytest

from host_runtime.engine.harmony import HarmonyText
from host_runtime.engine.tool_format import prepare, template_format, wants_argument_text
from host_runtime.engine.reasoning import prompt_thinking, split, template_thinks
from host_runtime.serving.tool_calls import ToolChoice, grammar_for, parse_output, parse_tools

TEMPLATE = (Path(__file__).parent / "templates" / "openai-gpt-oss-120b.jinja").read_text()
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = parse_tools({"tools": [WEATHER]})
# Answers in gpt-oss's own shape (after the prompt's `<|start|>assistant`; <|return|> and <|call|> end the generation
# and are not in the text).
ANSWER = ("<|channel|>analysis<|message|>The user says hi. Reply briefly.<|end|><|start|>assistant<|channel|>final"
          "<|message|>Hello! How can I help?")
CALL = ("<|channel|>analysis<|message|>Need the weather: call the tool.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}')


def rewrite(text: str, step: int | None = None) -> str:
    harmony = HarmonyText()
    pieces = [text] if step is None else [text[i:i + step] for i in range(0, len(text), step)]
    return "".join(harmony.feed(p) for p in pieces) + harmony.finish()


def test_the_format_is_chosen_from_gpt_oss_template_and_it_thinks():
    assert template_format(TEMPLATE) == "harmony" and template_thinks(TEMPLATE)
    assert prompt_thinking(TEMPLATE, "<|start|>user<|message|>hi<|end|><|start|>assistant") == "may-open"


@pytest.mark.parametrize("step", [None, 1, 3, 7])
def test_reasoning_answer_and_a_call_come_apart_whole_or_streamed(step):
    reasoning, answer = split(rewrite(ANSWER, step), "may-open")
    assert reasoning == "The user says hi. Reply briefly." and answer == "Hello! How can I help?"
    reasoning, rest = split(rewrite(CALL, step), "may-open")
    assert reasoning == "Need the weather: call the tool."
    content, calls = parse_output(rest, TOOLS)
    assert content is None and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    # A call's arguments run to <|call|> (the generation's end), whatever text they hold.
    odd = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"a<|end|>b<|start|>c"}')
    assert parse_output(rewrite(odd, step), TOOLS)[1][0].arguments == {"city": "a<|end|>b<|start|>c"}
    # The recipient before the channel, as the template writes past calls, reads the same.
    earlier = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}'
    assert parse_output(rewrite(earlier, step), TOOLS)[1][0].arguments == {"city": "Oslo"}


def test_text_that_is_not_harmony_passes_and_a_cut_answer_keeps_what_it_has():
    assert rewrite('{"city": "Paris"}', 2) == '{"city": "Paris"}'  # response_format's JSON, from the first token
    assert rewrite("Plain words") == "Plain words"
    assert rewrite("<|channel|>analysis<|mess") == ""  # cut in a header: nothing of it is text
    assert split(rewrite("<|channel|>analysis<|message|>Still thinking about it"), "may-open") == (
        "Still thinking about it", "")
    # A preamble (commentary to no one) is the answer's text.
    assert rewrite("<|channel|>commentary<|message|>Checking now.<|end|>") == "Checking now."


def test_the_conversation_renders_with_gpt_oss_template_as_the_engine_renders_it():
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    undescribed = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["function"][
        "parameters"]}}]  # no description: the template writes one as text
    messages, tools = prepare(conversation, "harmony", undescribed, argument_text=wants_argument_text(TEMPLATE))
    prompt = Jinja2ChatFormatter(template=TEMPLATE, eos_token="<|return|>", bos_token="<|startoftext|>",
                                 add_generation_prompt=True)(messages=messages, tools=tools).prompt
    assert "namespace functions {" in prompt and "type get_weather = (_: {" in prompt
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            '<|call|>') in prompt
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"18 C"<|end|>' in prompt
    assert prompt.endswith("<|start|>assistant")


def test_a_required_call_is_one_commentary_message_to_a_function():
    from llama_cpp.llama_grammar import LlamaGrammar

    grammar = grammar_for("harmony", TOOLS, ToolChoice("required"))
    assert grammar.splitlines()[0] == ('root ::= "<|channel|>commentary " ( "to=functions.get_weather" '
                                       '" <|constrain|>json<|message|>" args0x-root )')
    assert LlamaGrammar.from_string(grammar, verbose=False)
