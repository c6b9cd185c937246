"""XML-style tool calls (pure): the grammar that makes a required call parse, and reading calls back.

Inside the same <tool_call> tags Hermes uses, Qwen3-Coder writes
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>
and GLM 4.5 and later write
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>
A value is raw text (code spans lines and is not JSON-quoted); the tool's schema says what it is: a string stays
as written, anything else is read as JSON where it parses (as llama.cpp's parsers do)."""

from __future__ import annotations

import json
import re

from host_runtime.serving.json_schema_grammar import JSON_STRING_CHAR, NOT_SCALAR

FUNCTION_OPEN = "<function="
ARG_KEY = "<arg_key>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_GLM_CALL = re.compile(r"([A-Za-z0-9_.-]{1,64})\s*(.*)", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
# A raw value: any text without "</p" (Qwen3-Coder: "</parameter>" ends it) or "</a" (GLM: "</arg_value>");
# "<" and "</" otherwise stay possible. Never \x00: llama.cpp's grammar reads bytes that are not UTF-8 as code
# point 0, so excluding it keeps a byte-level model's broken sequences out; nor a code point no UTF-8 encodes,
# which llama.cpp decodes from bytes shaped like UTF-8 (json_schema_grammar.NOT_SCALAR: as JSON's string rule).
_VALUE_CHAR = {fmt: rf'xml-char ::= [^<\x00{NOT_SCALAR}] | "<" [^/\x00{NOT_SCALAR}] | "</" [^{c}\x00{NOT_SCALAR}]'
               for fmt, c in (("qwen3_coder", "p"), ("glm45", "a"))}
# JSON values for parameters that are not strings: loose (the call's shape is what the grammar promises).
_JSON_RULES = r'''json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws ( json-string ws ":" ws json-value ( ws "," ws json-string ws ":" ws json-value ){0,64} )? ws "}"
json-array ::= "[" ws ( json-value ( ws "," ws json-value ){0,256} )? ws "]"
json-string ::= "\"" ( JSON_STRING_CHAR | "\\" ["\\/bfnrt] ){0,4096} "\""
json-number ::= "-"? [0-9]{1,16} ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
ws ::= [ \t\n]{0,8}'''.replace("JSON_STRING_CHAR", JSON_STRING_CHAR)


def gbnf_literal(text: str) -> str:
    """A GBNF string literal (its escapes are JSON's)."""
    return json.dumps(text, ensure_ascii=False)


def _is_string(schema) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and kind == ["string"]):
        return True
    values = schema.get("enum") if "enum" in schema else ([schema["const"]] if "const" in schema else None)
    return kind is None and bool(values) and all(isinstance(v, str) for v in values)


def _value_rule(schema) -> str:
    """A parameter value's grammar: enum and const values as written, strings as raw text (at most maxLength
    characters), numbers, integers and booleans as such, anything else a JSON value."""
    if not isinstance(schema, dict):
        return "json-value"
    values = schema.get("enum") if "enum" in schema else ([schema["const"]] if "const" in schema else None)
    if values:
        return "( " + " | ".join(gbnf_literal(v if isinstance(v, str) else json.dumps(v)) for v in values) + " )"
    kind = schema.get("type")
    if _is_string(schema):
        most = schema.get("maxLength")
        least = schema.get("minLength", 0)
        if isinstance(most, int) and 0 <= most:
            return f"xml-char{{{min(least, most) if isinstance(least, int) else 0},{most}}}"
        return "xml-char*"
    if kind == "integer":
        return '"-"? [0-9]{1,16}'
    if kind == "number":
        return "json-number"
    if kind == "boolean":
        return '( "true" | "false" )'
    return "json-value"


def grammar(fmt: str, tools: list, parallel: bool, most_calls: int) -> str:
    """GBNF admitting only well-formed calls of `tools` (each a tool_calls.Tool) in `fmt`'s XML ("qwen3_coder" or
    "glm45"): every required parameter, the others optional, in the schema's order."""
    rules, bodies = [], []
    for i, tool in enumerate(tools):
        props = (tool.parameters or {}).get("properties") or {}
        required = set((tool.parameters or {}).get("required") or ())
        parts = []
        for name, schema in props.items():
            if fmt == "glm45":
                one = f'"\\n<arg_key>" {gbnf_literal(name)} "</arg_key>\\n<arg_value>" {_value_rule(schema)} "</arg_value>"'
            else:
                one = f'"<parameter=" {gbnf_literal(name)} ">\\n" {_value_rule(schema)} "\\n</parameter>\\n"'
            parts.append(one if name in required else f"( {one} )?")
        opener = gbnf_literal(tool.name) if fmt == "glm45" else f'{gbnf_literal(tool.name)} ">\\n"'
        rules.append(f"fn-{i} ::= {opener} " + (" ".join(parts) if parts else '""'))
        bodies.append(f"fn-{i}")
    if fmt == "glm45":
        call = f'call ::= "<tool_call>" ( {" | ".join(bodies)} ) "</tool_call>"'
    else:
        call = f'call ::= "<tool_call>\\n<function=" ( {" | ".join(bodies)} ) "</function>\\n</tool_call>"'
    root = "root ::= call" + (f' ( "\\n" call ){{0,{most_calls - 1}}}' if parallel else "")
    return "\n".join([root, call, *rules, _VALUE_CHAR[fmt], _JSON_RULES]) + "\n"


def _value(text: str, schema):
    if _is_string(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def is_xml_call(body: str) -> bool:
    """Whether a <tool_call> block's body is one of these XML calls rather than Hermes's JSON."""
    body = body.lstrip()
    return body.startswith(FUNCTION_OPEN) or (ARG_KEY in body and not body.startswith("{")) or \
        bool(re.fullmatch(r"[A-Za-z0-9_.-]{1,64}\s*", body))


def _pairs(inner: str, pattern: re.Pattern, trim_newlines: bool):
    """(key, raw value) pairs filling `inner` (only whitespace between them), or None."""
    pairs, last = [], 0
    for m in pattern.finditer(inner):
        if inner[last:m.start()].strip():
            return None  # text between parameters: not a call
        raw = m.group(2)
        if trim_newlines:
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
        pairs.append((m.group(1).strip(), raw))
        last = m.end()
    return None if inner[last:].strip() else pairs


def read_call(body: str, tools: list):
    """(name, arguments) from one <tool_call> block's body (Qwen3-Coder's "<function=NAME>...</function>" or GLM's
    "NAME <arg_key>...</arg_value>..."), or None when it is not a well-formed call of a known tool."""
    body = body.strip()
    if body.startswith(FUNCTION_OPEN):
        m = _FUNCTION.fullmatch(body)
        pattern, trim = _PARAMETER, True
    else:
        m = _GLM_CALL.fullmatch(body)
        pattern, trim = _GLM_ARG, False
    if m is None:
        return None
    name = m.group(1).strip()
    tool = next((t for t in tools if t.name == name), None)
    pairs = _pairs(m.group(2), pattern, trim) if tool is not None else None
    if pairs is None:
        return None
    props = (tool.parameters or {}).get("properties") or {}
    return name, {key: _value(raw, props.get(key)) for key, raw in pairs}
