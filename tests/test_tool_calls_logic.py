"""Tool calls (pure): the wire schema, the format per template, the grammar, and parsing answers back."""

import json
from pathlib import Path

import pytest

from host_runtime.serving.errors import APIError
from host_runtime.engine.tool_format import prepare, template_format, wants_argument_text
from host_runtime.serving.tool_calls import (ToolCallStream, ToolChoice, grammar_for, parse_output, parse_tool_choice,
                                             parse_tools)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                   "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = parse_tools({"tools": [WEATHER, TIME]})


def test_tools_are_checked_and_a_bad_one_is_named():
    assert [t.name for t in TOOLS] == ["get_weather", "get_time"]
    cases = [
        ({"tools": "x"}, "tools"),
        ({"tools": [WEATHER, {"type": "function"}]}, "tools[1]"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}}]}, "tools[0].function.parameters"),
    ]
    for body, param in cases:
        with pytest.raises(APIError) as err:
            parse_tools(body)
        assert err.value.status == 400 and err.value.param == param, (body, err.value.message)


def test_tool_choice():
    assert parse_tool_choice({}, TOOLS) == ToolChoice("auto")
    assert parse_tool_choice({}, []) == ToolChoice("none")
    assert parse_tool_choice({"tool_choice": "required", "parallel_tool_calls": False}, TOOLS) == \
        ToolChoice("required", parallel=False)
    named = parse_tool_choice({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, TOOLS)
    assert named == ToolChoice("named", "get_time") and named.constrained
    for body, param in [({"tool_choice": "always"}, "tool_choice"),
                        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
                        # an object as the name: a 500 before (schemathesis through /v1/responses found it)
                        ({"tool_choice": {"type": "function", "function": {"name": {}}}}, "tool_choice.function.name"),
                        ({"tool_choice": "auto", "parallel_tool_calls": "yes"}, "parallel_tool_calls")]:
        with pytest.raises(APIError) as err:
            parse_tool_choice(body, TOOLS)
        assert err.value.param == param
    with pytest.raises(APIError):
        parse_tool_choice({"tool_choice": "required"}, [])


def test_formats_follow_the_template():
    assert template_format("{% for tool in tools %}<tool_call>{% endfor %}") == "hermes"
    assert template_format("<|start_header_id|>ipython{{ tools }}<|python_tag|>") == "llama3"
    assert template_format("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]") == "mistral"
    assert template_format("<|im_start|>{{ message['role'] }}") == "generic"
    coder = (Path(__file__).parent / "templates" / "Qwen-Qwen3-Coder.jinja").read_text()
    assert template_format(coder) == "qwen3_coder"  # its <tool_call> tags are Hermes's too: XML wins
    glm = (Path(__file__).parent / "templates" / "zai-org-GLM-4.5.jinja").read_text()
    assert template_format(glm) == "glm45"


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>',
    '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}]',
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}]}',
    '{"tool_calls": [{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\", \\"unit\\": \\"c\\"}"}]}',
])
def test_every_format_parses_into_one_call(text):
    content, calls = parse_output(text, TOOLS)
    assert content is None and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo", "unit": "c"})]
    wire = calls[0].wire(0)
    assert wire["id"].startswith("call_") and json.loads(wire["function"]["arguments"]) == {"city": "Oslo", "unit": "c"}


def test_parallel_calls_and_text_around_them():
    text = ('Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}\n</tool_call>')
    content, calls = parse_output(text, TOOLS)
    assert content == "Let me check." and [c.name for c in calls] == ["get_time", "get_weather"]
    assert len({c.id for c in calls}) == 2
    _, calls = parse_output('{"name": "get_time", "parameters": {}}; {"name": "get_time", "parameters": {}}', TOOLS)
    assert len(calls) == 2
    one = ToolCallStream(TOOLS, parallel=False)  # parallel_tool_calls false: the first call alone
    one.feed(text)
    assert [c.name for c in one.finish()[1]] == ["get_time"]


@pytest.mark.parametrize("text", [
    "The weather is fine.",
    '{"name": "unknown_tool", "arguments": {}}',       # not a tool we offered
    '<tool_call>{"name": "get_weather", "arguments": </tool_call>',  # malformed
    '{"answer": 42}',
    '{"name": "get_weather", "arguments": [1, 2]}',   # arguments not an object
])
def test_what_is_not_a_well_formed_call_stays_content(text):
    assert parse_output(text, TOOLS) == (text, [])


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "glm45", "llama3", "mistral", "generic"])
def test_grammars_compile_in_llama_cpp(fmt):
    from llama_cpp.llama_grammar import LlamaGrammar

    for choice in (ToolChoice("required"), ToolChoice("named", "get_weather"), ToolChoice("required", parallel=False)):
        grammar = grammar_for(fmt, TOOLS, choice)
        LlamaGrammar.from_string(grammar, verbose=False)  # raises on a grammar llama.cpp cannot parse
        assert "root ::=" in grammar


def test_a_named_choice_admits_only_that_tool():
    grammar = grammar_for("hermes", TOOLS, ToolChoice("named", "get_time"))
    assert "get_time" in grammar and "get_weather" not in grammar
    assert grammar.startswith('root ::= "<tool_call>\\n" tool-call-body "\\n</tool_call>"\n')  # called once
    assert grammar_for("hermes", TOOLS, ToolChoice("required")).startswith(
        'root ::= "<tool_call>\\n" tool-call-body "\\n</tool_call>" ("\\n"')


def _stream(pieces: list[str]) -> tuple[str, list]:
    s = ToolCallStream(TOOLS)
    sent = "".join(s.feed(p) for p in pieces)
    rest, calls = s.finish()
    return sent + rest, calls


def test_a_stream_sends_text_at_once_and_holds_a_call_from_its_first_sign():
    s = ToolCallStream(TOOLS)
    assert s.feed("Sure") == "Sure"
    assert s.feed(", one moment <tool") == ", one moment "  # "<tool" might open a call: held
    assert s.feed('_call>\n{"name": "get_time", ') == ""
    assert s.feed('"arguments": {}}\n</tool_call>') == ""
    rest, calls = s.finish()
    assert rest == "" and [c.name for c in calls] == ["get_time"]


def test_a_stream_that_starts_with_json_is_held_whole():
    text, calls = _stream(["  ", '{"tool_', 'calls": [{"name": "get_time", "arguments": {}}]}'])
    assert text == "" and [c.name for c in calls] == ["get_time"]
    # JSON that is not a call comes out whole as content, at the end.
    assert _stream(['{"a"', ": 1}"]) == ('{"a": 1}', [])
    # JSON after some text is text.
    assert _stream(["Here: ", '{"name": "get_time", "arguments": {}}']) == \
        ('Here: {"name": "get_time", "arguments": {}}', [])
    # A "<" that opens no marker goes out once it is clear.
    assert _stream(["a <", "b"]) == ("a <b", [])


CONVERSATION = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Oslo", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4 C, rain"},
]


def test_a_template_with_tools_gets_them_and_calls_as_objects():
    messages, tools = prepare(CONVERSATION, "hermes", [WEATHER])
    assert tools == [WEATHER]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "unit": "c"}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "4 C, rain", "name": "get_weather"}


def test_the_generic_format_writes_tools_calls_and_results_as_text():
    messages, tools = prepare([{"role": "system", "content": "Be brief."}] + CONVERSATION, "generic", [WEATHER])
    assert tools is None
    assert messages[0]["content"].startswith("Be brief.\n\nYou can call these tools") and "get_weather" in messages[0]["content"]
    assert json.loads(messages[2]["content"]) == {"tool_calls": [{"name": "get_weather",
                                                                 "arguments": {"city": "Oslo", "unit": "c"}}]}
    assert messages[3]["role"] == "user" and json.loads(messages[3]["content"])["tool_response"]["name"] == "get_weather"


def test_a_required_calls_grammar_ends_after_the_most_parallel_calls():
    from host_runtime.serving.tool_calls import MAX_PARALLEL_CALLS

    hermes = grammar_for("hermes", TOOLS, ToolChoice("required"))
    assert hermes.splitlines()[0].endswith(f'){{0,{MAX_PARALLEL_CALLS - 1}}}')
    generic = grammar_for("generic", TOOLS, ToolChoice("required"))
    # The converter writes maxItems out: the list closes ("]") after the 8th call at the latest.
    calls_rule = next(line for line in generic.splitlines() if line.startswith("tool-calls ::="))
    assert calls_rule.count("tool-calls-item") == MAX_PARALLEL_CALLS and calls_rule.endswith('"]" space')


@pytest.mark.parametrize("text,names", [
    ('{"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Pa',
     ["get_time"]),
    ('[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}, {"name": "get_ti',
     ["get_time", "get_time"]),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_weath',
     ["get_time"]),
])
def test_the_whole_calls_before_a_cut_one_are_calls_when_max_tokens_cut_the_answer(text, names):
    """The review: a small model repeating a required call until max_tokens ran out came back with no tool_calls
    at all, only the cut JSON as content. Cut by max_tokens, the whole calls before the cut one are calls."""
    content, calls = parse_output(text, TOOLS, truncated=True)
    assert [c.name for c in calls] == names and not content
    assert parse_output(text, TOOLS) == (text, [])  # not cut by max_tokens: malformed, so all content
    stream = ToolCallStream(TOOLS)
    assert stream.feed(text) == ""
    assert [c.name for c in stream.finish(truncated=True)[1]] == names
    assert parse_output('{"tool_calls": [{"name": "nope", "argu', TOOLS, truncated=True)[1] == []


CODE = {"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                                    "mode": {"type": "integer"}, "append": {"type": "boolean"},
                                    "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["path", "content"]}}}
CODER_TOOLS = parse_tools({"tools": [WEATHER, TIME, CODE]})


def test_qwen3_coders_xml_calls_are_read_with_their_schemas_types():
    """Qwen3-Coder's calls came back as plain text (#34)."""
    text = ("I'll write it.\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
            "<parameter=content>\nif a < b and c</d:\n    print(\"x\")\n\n</parameter>\n<parameter=mode>\n420\n"
            "</parameter>\n<parameter=append>\nfalse\n</parameter>\n<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n"
            "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>")
    content, calls = parse_output(text, CODER_TOOLS)
    assert content == "I'll write it."
    assert [(c.name, c.arguments) for c in calls] == [
        ("write_file", {"path": "src/a.py", "content": 'if a < b and c</d:\n    print("x")\n', "mode": 420,
                        "append": False, "tags": ["x", "y"]}),
        ("get_time", {})]
    # A string that looks like a number stays a string; a value that is not JSON where JSON is wanted stays text.
    _, (call,) = parse_output("<tool_call>\n<function=write_file>\n<parameter=path>\n42\n</parameter>\n"
                              "<parameter=content>\nx\n</parameter>\n<parameter=mode>\nrw\n</parameter>\n"
                              "</function>\n</tool_call>", CODER_TOOLS)
    assert call.arguments == {"path": "42", "content": "x", "mode": "rw"}
    streamed = ToolCallStream(CODER_TOOLS)
    sent = "".join(streamed.feed(text[i:i + 5]) for i in range(0, len(text), 5))
    rest, streamed_calls = streamed.finish()
    assert (sent + rest).strip() == "I'll write it." and [c.name for c in streamed_calls] == ["write_file", "get_time"]


@pytest.mark.parametrize("text", [
    "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>",                      # not a tool we offered
    "<tool_call>\n<function=get_time>\nstray text\n</function>\n</tool_call>",        # text between parameters
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</tool_call>",      # never closed
])
def test_what_is_not_a_well_formed_xml_call_stays_content(text):
    assert parse_output(text, CODER_TOOLS) == (text, [])


def test_an_xml_call_cut_by_max_tokens_keeps_the_whole_calls_before_it():
    text = ("<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nOs")
    content, calls = parse_output(text, CODER_TOOLS, truncated=True)
    assert [c.name for c in calls] == ["get_time"] and not content


def test_the_xml_grammar_writes_each_tools_parameters_in_order_required_ones_always():
    from host_runtime.serving.tool_calls import MAX_PARALLEL_CALLS

    grammar = grammar_for("qwen3_coder", CODER_TOOLS, ToolChoice("required"))
    lines = grammar.splitlines()
    assert lines[0] == f'root ::= call ( "\\n" call ){{0,{MAX_PARALLEL_CALLS - 1}}}'
    weather = next(line for line in lines if line.startswith("fn-0 ::="))
    # city: raw text up to maxLength 20; unit: its enum's values as written; both required (not optional).
    assert '"<parameter=" "city" ">\\n" xml-char{0,20} "\\n</parameter>\\n"' in weather
    assert '( "c" | "f" )' in weather and "( \"<parameter=\"" not in weather
    code = next(line for line in lines if line.startswith("fn-2 ::="))
    assert '( "<parameter=" "mode" ">\\n" "-"? [0-9]{1,16}' in code  # optional, an integer
    named = grammar_for("qwen3_coder", CODER_TOOLS, ToolChoice("named", "get_time"))
    assert named.splitlines()[0] == "root ::= call" and "get_weather" not in named


def test_glms_calls_are_read_with_their_schemas_types():
    text = ("<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>src/a.py</arg_value>\n<arg_key>content</arg_key>"
            "\n<arg_value>x = 1 < 2\n</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>420</arg_value>\n</tool_call>"
            "\n<tool_call>get_time\n</tool_call>")
    content, calls = parse_output(text, CODER_TOOLS)
    assert content is None and [(c.name, c.arguments) for c in calls] == [
        ("write_file", {"path": "src/a.py", "content": "x = 1 < 2\n", "mode": 420}), ("get_time", {})]
    for bad in ("<tool_call>rm_rf\n</tool_call>", "<tool_call>get_time\nstray\n</tool_call>",
                "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</tool_call>"):
        assert parse_output(bad, CODER_TOOLS) == (bad, []), bad
    grammar = grammar_for("glm45", CODER_TOOLS, ToolChoice("named", "get_weather")).splitlines()
    assert grammar[:2] == ["root ::= call", 'call ::= "<tool_call>" ( fn-0 ) "</tool_call>"']
    assert grammar[2].startswith('fn-0 ::= "get_weather" "\\n<arg_key>" "city" "</arg_key>\\n<arg_value>" xml-char{0,20}')


DS_TEMPLATE = (Path(__file__).parent / "templates" / "deepseek-ai-DeepSeek-V3.1.jinja").read_text()
# DeepSeek V3.1's calls as the model writes them (its format: name, separator, JSON arguments; chained, no spaces).
DS_ANSWER = ("Let me look that up.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
             '{"city": "Paris", "unit": "c"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}'
             "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")


def test_deepseek_v31_calls_are_read_whole_streamed_and_cut():
    """DeepSeek V3.1's calls came back as plain text (#34)."""
    assert template_format(DS_TEMPLATE) == "deepseek_v31"
    content, calls = parse_output(DS_ANSWER, TOOLS)
    assert content == "Let me look that up."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris", "unit": "c"}),
                                                      ("get_time", {})]
    streamed = ToolCallStream(TOOLS)
    sent = "".join(streamed.feed(DS_ANSWER[i:i + 3]) for i in range(0, len(DS_ANSWER), 3))
    rest, streamed_calls = streamed.finish()
    assert (sent + rest) == "Let me look that up." and [c.name for c in streamed_calls] == ["get_weather", "get_time"]
    cut = DS_ANSWER[:DS_ANSWER.index("get_time") + 12]
    content, calls = parse_output(cut, TOOLS, truncated=True)
    assert [c.name for c in calls] == ["get_weather"]
    assert parse_output(cut, TOOLS) == (cut, [])  # not cut by max_tokens: a malformed answer stays content
    for bad in ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>rm_rf<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"a": <｜tool▁call▁end｜><｜tool▁calls▁end｜>'):
        assert parse_output(bad, TOOLS) == (bad, []), bad


def test_deepseek_v31_gets_its_tools_in_the_system_message_and_arguments_as_text():
    """Its template renders no tool list and concatenates a call's arguments as a string."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    # DeepSeek's own template joins the arguments' string; llama.cpp's edited copy writes an object with tojson.
    edited = (Path(__file__).parent / "templates" / "deepseek-ai-DeepSeek-V3.1-tojson.jinja").read_text()
    assert wants_argument_text(DS_TEMPLATE) and not wants_argument_text(edited) and template_format(edited) == \
        "deepseek_v31"
    for template in (DS_TEMPLATE, edited):
        messages, tools = prepare(conversation, "deepseek_v31", [WEATHER, TIME], argument_text=wants_argument_text(
            template))
        assert tools is None and messages[0]["content"].startswith("Be brief.\n\n## Tools")
        assert "### get_weather" in messages[0]["content"]
        assert "<｜tool▁sep｜>tool_call_arguments" in messages[0]["content"]
        rendered = Jinja2ChatFormatter(template=template, eos_token="</s>", bos_token="<s>",
                                       add_generation_prompt=True)(messages=messages).prompt  # the engine's renderer
        at = rendered.rindex("<｜tool▁call▁begin｜>")  # the conversation's call, after the instructions' example
        call = rendered[at:rendered.index("<｜tool▁call▁end｜>", at)]
        assert call.startswith("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{")  # JSON, never a quoted string
        assert json.loads(call.split("<｜tool▁sep｜>")[1]) == {"city": "Paris", "unit": "c"}
        assert "<｜tool▁output▁begin｜>18 C<｜tool▁output▁end｜>" in rendered


def test_the_deepseek_grammar_chains_calls_with_each_tools_own_arguments():
    from host_runtime.serving.tool_calls import MAX_PARALLEL_CALLS

    grammar = grammar_for("deepseek_v31", TOOLS, ToolChoice("required"))
    lines = grammar.splitlines()
    assert lines[0] == (f'root ::= "<｜tool▁calls▁begin｜>" call call{{0,{MAX_PARALLEL_CALLS - 1}}} '
                        '"<｜tool▁calls▁end｜>"')
    assert lines[1] == ('call ::= "<｜tool▁call▁begin｜>" ( "get_weather" "<｜tool▁sep｜>" args0x-root | '
                        '"get_time" "<｜tool▁sep｜>" args1x-root ) "<｜tool▁call▁end｜>"')
    defined = [line.split(" ::=")[0] for line in lines if " ::=" in line]
    assert len(defined) == len(set(defined))  # each tool's converted rules renamed apart
    assert any(name.startswith("args0x-") for name in defined) and any(name.startswith("args1x-") for name in defined)
    named = grammar_for("deepseek_v31", TOOLS, ToolChoice("named", "get_time"))
    assert named.splitlines()[0] == 'root ::= "<｜tool▁calls▁begin｜>" call "<｜tool▁calls▁end｜>"'
    assert "get_weather" not in named
    from llama_cpp.llama_grammar import LlamaGrammar

    assert LlamaGrammar.from_string(grammar, verbose=False)  # llama.cpp's parser takes it


def test_a_json_string_character_is_a_unicode_scalar_value():
    """The converter's char took any code point: llama.cpp decodes a token's bytes unchecked, so a lead byte past
    F4 or an encoded surrogate passed as one character and came out as a U+FFFD per byte, past maxLength
    (serving/json_schema_grammar.py). Compiled by llama.cpp itself, the class refuses them and keeps the rest."""
    import llama_cpp

    from host_runtime.engine.model import default_model_path
    from host_runtime.serving import tool_calls_xml
    from host_runtime.serving.json_schema_grammar import NOT_SCALAR, json_object_grammar, schema_grammar
    from host_runtime.serving.tool_calls import Tool

    grammar = schema_grammar({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}})
    char = next(line for line in grammar.splitlines() if line.startswith("char ::="))
    assert r"\uD800-\uDFFF" in char and r"\U00110000-\U7FFFFFFF" in char and r"\x00-\x1F" in char
    # The same class wherever a grammar holds text: any JSON object's, and the XML calls' values.
    tools = [Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                                     "days": {"type": "integer"}}})]
    others = [json_object_grammar(), tool_calls_xml.grammar("qwen3_coder", tools, True, 8),
              tool_calls_xml.grammar("glm45", tools, True, 8)]
    assert all(NOT_SCALAR in g for g in others)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(default_model_path()).encode(), params)
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        for g in [grammar, *others]:
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, g.encode(), b"root")
            assert sampler, "llama.cpp refused the grammar"
            llama_cpp.llama_sampler_free(sampler)
    finally:
        llama_cpp.llama_model_free(model)
