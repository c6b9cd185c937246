"""Qwen3-Coder's XML tool calls (pure): the grammar that makes a required call parse, and reading calls back.

The model writes, inside the same <tool_call> tags Hermes uses:
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>
A parameter's value is raw text (code spans lines and is not JSON-quoted); the tool's schema says what it is: a
string stays as written, anything else is read as JSON where it parses (as llama.cpp's parser does)."""

from __future__ import annotations

import json
import re

FUNCTION_OPEN = "<function="
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
# A raw value: any text without "</p" (so "</parameter>" ends it; "<" and "</" otherwise stay possible).
_VALUE_CHAR = 'xml-char ::= [^<] | "<" [^/] | "</" [^p]'
# JSON values for parameters that are not strings: loose (the call's shape is what the grammar promises).
_JSON_RULES = r'''json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws ( json-string ws ":" ws json-value ( ws "," ws json-string ws ":" ws json-value ){0,64} )? ws "}"
json-array ::= "[" ws ( json-value ( ws "," ws json-value ){0,256} )? ws "]"
json-string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ["\\/bfnrt] ){0,4096} "\""
json-number ::= "-"? [0-9]{1,16} ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
ws ::= [ \t\n]{0,8}'''


def _literal(text: str) -> str:
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
        return "( " + " | ".join(_literal(v if isinstance(v, str) else json.dumps(v)) for v in values) + " )"
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


def grammar(tools: list, parallel: bool, most_calls: int) -> str:
    """GBNF admitting only well-formed XML calls of `tools` (each a tool_calls.Tool): every required parameter,
    the others optional, in the schema's order."""
    rules, bodies = [], []
    for i, tool in enumerate(tools):
        props = (tool.parameters or {}).get("properties") or {}
        required = set((tool.parameters or {}).get("required") or ())
        parts = []
        for name, schema in props.items():
            one = f'"<parameter=" {_literal(name)} ">\\n" {_value_rule(schema)} "\\n</parameter>\\n"'
            parts.append(one if name in required else f"( {one} )?")
        rules.append(f"fn-{i} ::= {_literal(tool.name)} \">\\n\" " + (" ".join(parts) if parts else '""'))
        bodies.append(f"fn-{i}")
    call = f'call ::= "<tool_call>\\n<function=" ( {" | ".join(bodies)} ) "</function>\\n</tool_call>"'
    root = "root ::= call" + (f' ( "\\n" call ){{0,{most_calls - 1}}}' if parallel else "")
    return "\n".join([root, call, *rules, _VALUE_CHAR, _JSON_RULES]) + "\n"


def _value(text: str, schema):
    if _is_string(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_call(body: str, tools: list):
    """(name, arguments) from one call's body ("<function=NAME>...</function>"), or None when it is not a
    well-formed call of a known tool."""
    m = _FUNCTION.fullmatch(body.strip())
    if m is None:
        return None
    name, inner = m.group(1).strip(), m.group(2)
    tool = next((t for t in tools if t.name == name), None)
    if tool is None:
        return None
    props = (tool.parameters or {}).get("properties") or {}
    args, last = {}, 0
    for p in _PARAMETER.finditer(inner):
        if inner[last:p.start()].strip():
            return None  # text between parameters: not a call
        raw = p.group(2)
        raw = raw[1:] if raw.startswith("\n") else raw
        raw = raw[:-1] if raw.endswith("\n") else raw
        key = p.group(1).strip()
        args[key] = _value(raw, props.get(key))
        last = p.end()
    if inner[last:].strip():
        return None
    return name, args
