"""Tool calls (pure): the OpenAI `tools` wire schema, the grammar that makes a required call parse, and parsing
the model's output back into `tool_calls` (whole, or as it streams), for the call formats of
engine/tool_format.py. Whatever the format, output in one of the other shapes is still read as a call.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from host_runtime.engine.tool_format import (DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP,
                                             HERMES_CLOSE, HERMES_OPEN, MISTRAL_OPEN, PYTHON_TAG)
from host_runtime.serving import tool_calls_xml
from host_runtime.serving.tool_calls_xml import gbnf_literal
from host_runtime.serving.errors import APIError
from host_runtime.serving.grammar_budget import MAX_TOOLS_GRAMMAR_BYTES, GrammarBudget, check_grammar_size
from host_runtime.serving.json_schema_grammar import schema_grammar

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_TOOLS = 128
# A required call's grammar ends after this many parallel calls: a small model would otherwise repeat the same
# call until max_tokens ran out (4 of 10 seeds at temperature 0.7, SmolLM2 and one weather tool).
MAX_PARALLEL_CALLS = 8
# The converter names a call's rules after the wrapping around each tool's parameters (tool-calls-item-...).
CALL_RULE_PREFIX_BYTES = 32


def _bad(message: str, param: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def wire(self) -> dict:
        """The OpenAI shape, as chat templates expect it."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"          # auto | none | required | named
    name: str | None = None     # the function, when named
    parallel: bool = True

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def wire(self, index: int | None = None) -> dict:
        doc = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}
        return doc if index is None else {"index": index, **doc}


# ---- the request ---------------------------------------------------------------------------------------------

def parse_tools(body: dict) -> list[Tool]:
    """`tools`, checked: each a function with a valid name and a JSON Schema the grammar converter accepts. All
    the tools' schemas share one grammar budget (serving/grammar_budget.py), charged before any is converted,
    whatever `tool_choice` says: each is converted here to check it, and a required call converts them all."""
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array of tools", "tools", "invalid_type")
    if len(tools) > MAX_TOOLS:
        raise _bad(f"'tools' has {len(tools)} tools; at most {MAX_TOOLS} are allowed", "tools")
    out, seen, budget = [], set(), GrammarBudget()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise _bad(f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}", where, "invalid_type")
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise _bad(f"'{where}.function.name' must be 1 to 64 letters, digits, '_', '.' or '-', got {name!r}",
                       f"{where}.function.name")
        if name in seen:
            raise _bad(f"'{where}.function.name' {name!r} is given twice", f"{where}.function.name")
        seen.add(name)
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise _bad(f"'{where}.function.description' must be a string", f"{where}.function.description",
                       "invalid_type")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise _bad(f"'{where}.function.parameters' must be a JSON Schema object", f"{where}.function.parameters",
                       "invalid_type")
        if params.get("type", "object") != "object":
            raise _bad(f"'{where}.function.parameters' must describe an object (\"type\": \"object\"), got "
                       f"{params.get('type')!r}", f"{where}.function.parameters")
        budget.charge(params, f"{where}.function.parameters", CALL_RULE_PREFIX_BYTES)
        try:
            grammar = schema_grammar(params)
        except Exception as exc:  # the converter raises bare Exceptions and KeyErrors for what it cannot read
            raise _bad(f"'{where}.function.parameters' is not a JSON Schema this server can follow: "
                       f"{type(exc).__name__}: {exc}", f"{where}.function.parameters") from None
        check_grammar_size(grammar, MAX_TOOLS_GRAMMAR_BYTES, f"{where}.function.parameters",
                           f"'{where}.function.parameters'")
        out.append(Tool(name, description, params))
    return out


def parse_tool_choice(body: dict, tools: list[Tool]) -> ToolChoice:
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls", "invalid_type")
    if choice is None:
        return ToolChoice("auto" if tools else "none", parallel=parallel)
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise _bad(f"'tool_choice' must be 'auto', 'none', 'required' or a named function, got {choice!r}",
                       "tool_choice")
        if choice == "required" and not tools:
            raise _bad("'tool_choice' is 'required' but no 'tools' are given", "tool_choice")
        return ToolChoice(choice, parallel=parallel)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):  # an object here was a TypeError (a 500) building the set lookup
            raise _bad("'tool_choice.function.name' must be a string", "tool_choice.function.name", "invalid_type")
        if name not in {t.name for t in tools}:
            raise _bad(f"'tool_choice' names the function {name!r}, which is not among 'tools'",
                       "tool_choice.function.name")
        return ToolChoice("named", name, parallel=parallel)
    raise _bad("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": "
               "{\"name\": ...}}", "tool_choice", "invalid_type")


# ---- the grammar ---------------------------------------------------------------------------------------------

def _arguments_key(fmt: str) -> str:
    return "parameters" if fmt == "llama3" else "arguments"


def _call_schema(tools: list[Tool], fmt: str) -> dict:
    key = _arguments_key(fmt)
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, key: t.parameters},
                       "required": ["name", key]} for t in tools]}


_LITERAL = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]')


def _rename_rule(grammar: str, old: str, new: str) -> str:
    """Rename a rule everywhere it is named, leaving string literals and character classes alone."""
    out, last = [], 0
    for m in _LITERAL.finditer(grammar):
        out.append(re.sub(rf"(?<![\w-]){re.escape(old)}(?![\w-])", new, grammar[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(re.sub(rf"(?<![\w-]){re.escape(old)}(?![\w-])", new, grammar[last:]))
    return "".join(out)


def grammar_for(fmt: str, tools: list[Tool], choice: ToolChoice) -> str:
    """GBNF that admits only well-formed calls of the allowed tools, in the format's wrapping; refused past
    MAX_TOOLS_GRAMMAR_BYTES (the tools were weighed by parse_tools before any conversion)."""
    return check_grammar_size(_call_grammar(fmt, tools, choice), MAX_TOOLS_GRAMMAR_BYTES, "tools",
                              "the tools together")


def _call_grammar(fmt: str, tools: list[Tool], choice: ToolChoice) -> str:
    allowed = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    parallel = choice.parallel and choice.mode != "named"  # a named function is called once
    if fmt == "hermes":
        call = _rename_rule(schema_grammar(_call_schema(allowed, fmt)), "root", "tool-call-body")
        one = f'"{HERMES_OPEN}\\n" tool-call-body "\\n{HERMES_CLOSE}"'
        root = f"root ::= {one}" + (f' ("\\n" {one}){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "")
        return root + "\n" + call
    if fmt == "llama3":
        return schema_grammar(_call_schema(allowed, fmt))  # one call: Llama 3's format has no list
    if fmt in ("qwen3_coder", "glm45"):
        return tool_calls_xml.grammar(fmt, allowed, parallel, MAX_PARALLEL_CALLS)
    if fmt == "deepseek_v31":
        return _deepseek_grammar(allowed, parallel)
    if fmt == "harmony":
        return _harmony_grammar(allowed)
    # mistral (its [TOOL_CALLS] marker is a special token a grammar cannot write) and generic: JSON
    items = {"type": "array", "items": _call_schema(allowed, fmt), "minItems": 1,
             "maxItems": MAX_PARALLEL_CALLS if parallel else 1}
    if fmt == "mistral":
        return schema_grammar(items)
    return schema_grammar({"type": "object", "properties": {"tool_calls": items}, "required": ["tool_calls"]})


_RULE_NAME = re.compile(r"^([\w-]+) ::=", re.M)


def _arguments_grammars(tools: list[Tool]) -> tuple[list[str], list[str]]:
    """Each tool's arguments by its own schema: one converted grammar per tool, its rules renamed apart (the
    converter names them alike: root, space, value...). (the rules, each tool's root rule's name)"""
    rules, roots = [], []
    for i, tool in enumerate(tools):
        grammar = schema_grammar(tool.parameters or {"type": "object"})
        for name in _RULE_NAME.findall(grammar):
            grammar = _rename_rule(grammar, name, f"args{i}x-{name}")
        rules.append(grammar.strip())
        roots.append(f"args{i}x-root")
    return rules, roots


def _deepseek_grammar(tools: list[Tool], parallel: bool) -> str:
    """NAME<｜tool▁sep｜>{arguments} per call, chained between DeepSeek's markers."""
    rules, roots = _arguments_grammars(tools)
    bodies = [f"{gbnf_literal(t.name)} {gbnf_literal(DS_SEP)} {root}" for t, root in zip(tools, roots)]
    call = f"call ::= {gbnf_literal(DS_CALL_BEGIN)} ( {' | '.join(bodies)} ) {gbnf_literal(DS_CALL_END)}"
    root = (f"root ::= {gbnf_literal(DS_CALLS_BEGIN)} call" + (f" call{{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else "")
            + f" {gbnf_literal(DS_CALLS_END)}")
    return "\n".join([root, call, *rules]) + "\n"


def _harmony_grammar(tools: list[Tool]) -> str:
    """One commentary message to a function, its JSON arguments by the tool's schema; <|call|> ends it (the
    model's end-of-generation token, which the grammar lets through once it is complete). One call: gpt-oss
    makes one a turn."""
    rules, roots = _arguments_grammars(tools)
    bodies = [f'{gbnf_literal("to=functions." + t.name)} " <|constrain|>json<|message|>" {root}'
              for t, root in zip(tools, roots)]
    return "\n".join([f'root ::= "<|channel|>commentary " ( {" | ".join(bodies)} )', *rules]) + "\n"


_DS_CALL = re.compile(re.escape(DS_CALL_BEGIN) + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)" + re.escape(DS_CALL_END), re.S)


def _deepseek_calls(text: str, names: set[str], truncated: bool) -> tuple[str | None, list[ToolCall]]:
    """DeepSeek V3.1's calls: the text before the first call is content; every call whole and of a known tool, or
    the whole answer stays content (cut by max_tokens: the whole calls before the cut one)."""
    at = min(i for i in (text.find(DS_CALLS_BEGIN), text.find(DS_CALL_BEGIN)) if i >= 0)
    content, rest = text[:at].strip(), text[at:]
    calls, end = [], len(DS_CALLS_BEGIN) if rest.startswith(DS_CALLS_BEGIN) else 0
    for m in _DS_CALL.finditer(rest, end):
        if rest[end:m.start()].strip():
            break  # text between calls: not this format's chain
        try:
            args = _loads(m.group(2).strip())
        except ValueError:
            args = None
        name = m.group(1).strip()
        if name not in names or not isinstance(args, dict):
            break
        calls.append(ToolCall(name, args))
        end = m.end()
    tail = rest[end:].strip()
    whole = tail in ("", DS_CALLS_END) or tail.startswith(DS_CALLS_END) and not tail[len(DS_CALLS_END):].strip()
    if calls and (whole or truncated):
        return content or None, calls
    return text, []


# ---- the output ----------------------------------------------------------------------------------------------

def _loads(text: str):
    return json.loads(text, strict=False)  # raw control characters in strings, as small models write them


def _as_call(doc, names: set[str]) -> ToolCall | None:
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("function"), dict):  # the OpenAI shape, which some models echo
        doc = doc["function"]
    name = doc.get("name")
    args = doc.get("arguments", doc.get("parameters"))
    if isinstance(args, str):
        try:
            args = _loads(args)
        except ValueError:
            return None
    if args is None and ("arguments" not in doc and "parameters" not in doc):
        args = {}
    if name not in names or not isinstance(args, dict):
        return None
    return ToolCall(name, args)


def _calls_from_json(doc, names: set[str]) -> list[ToolCall] | None:
    if isinstance(doc, dict) and isinstance(doc.get("tool_calls"), list):
        doc = doc["tool_calls"]
    docs = doc if isinstance(doc, list) else [doc]
    calls = [_as_call(d, names) for d in docs]
    return calls if calls and all(c is not None for c in calls) else None


def _json_values(text: str) -> list | None:
    """One or more JSON values separated by whitespace or ';' (Llama 3 writes parallel calls so), else None."""
    decoder = json.JSONDecoder(strict=False)
    values, i, text = [], 0, text.strip()
    while i < len(text):
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)
        i = end
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
    return values or None


_LIST_OPENING = re.compile(r'\s*(\{\s*"tool_calls"\s*:\s*)?')


def _calls_before_the_cut(text: str, names: set[str]) -> list[ToolCall]:
    """The whole calls of a JSON list of calls that max_tokens cut off ({"tool_calls": [a, b, c... or [a, b, c...):
    each item that parses completely, up to the cut one."""
    at = text.find("[")
    if at < 0 or not _LIST_OPENING.fullmatch(text[:at]):
        return []
    decoder, i, calls = json.JSONDecoder(strict=False), at + 1, []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return calls
        call = _as_call(value, names)
        if call is None:
            return calls
        calls.append(call)


def parse_output(text: str, tools: list[Tool], truncated: bool = False) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) from a whole answer. Text that is not a well-formed call of a known tool stays content.
    `truncated`: the answer ended at max_tokens; the whole calls before the cut one are still calls (the cut one is
    dropped, and the finish reason, `length`, says why)."""
    names = {t.name for t in tools}
    if DS_CALL_BEGIN in text:
        return _deepseek_calls(text, names, truncated)
    if HERMES_OPEN in text:
        calls, content, rest = [], [], text
        while HERMES_OPEN in rest:
            before, _, after = rest.partition(HERMES_OPEN)
            body, closed, rest = after.partition(HERMES_CLOSE)
            found = None
            if tool_calls_xml.is_xml_call(body):  # Qwen3-Coder's or GLM's XML call
                read = tool_calls_xml.read_call(body, tools)
                found = [ToolCall(*read)] if read else None
            else:
                try:
                    found = _calls_from_json(_loads(body.strip()), names)
                except ValueError:
                    pass
            if found is None and truncated and not closed and calls:
                content.append(before)
                rest = ""
                break  # the call max_tokens cut: dropped, the whole ones before it kept
            if found is None:
                return text, []  # a malformed call: the whole answer is content, nothing half-parsed
            content.append(before)
            calls += found
            if not closed:
                rest = ""
        content.append(rest)
        joined = "".join(content).strip()
        return joined or None, calls
    stripped = text.strip()
    for marker in (MISTRAL_OPEN, PYTHON_TAG):
        if stripped.startswith(marker):
            stripped = stripped[len(marker):].strip()
    if stripped[:1] in ("{", "["):
        values = _json_values(stripped)
        if values is not None:
            calls = []
            for value in values:
                found = _calls_from_json(value, names)
                if found is None:
                    return text, []
                calls += found
            return None, calls
        if truncated:
            calls = _calls_before_the_cut(stripped, names)
            if calls:
                return None, calls
    return text, []


class ToolCallStream:
    """Splits a streamed answer: text that cannot be part of a call goes out as content at once; from the first
    sign of a call (a <tool_call> or [TOOL_CALLS] marker anywhere, or JSON at the very start) the rest is held
    and parsed when the answer ends."""

    OPENERS = (HERMES_OPEN, MISTRAL_OPEN, PYTHON_TAG, DS_CALLS_BEGIN, DS_CALL_BEGIN)

    def __init__(self, tools: list[Tool], parallel: bool = True):
        self.tools = tools
        self.parallel = parallel  # False: the answer's first call alone (parallel_tool_calls false)
        self._sent_any = False    # content already sent: JSON from here on is text, not a call
        self._pending = ""        # not yet sent: a possible marker's beginning, or leading whitespace
        self._held: str | None = None  # from a call's first sign on

    def feed(self, text: str) -> str:
        """Content to send now."""
        if self._held is not None:
            self._held += text
            return ""
        buf = self._pending + text
        if not self._sent_any and buf.lstrip()[:1] in ("{", "["):
            self._held, self._pending = buf, ""
            return ""
        for opener in self.OPENERS:
            at = buf.find(opener)
            if at >= 0:
                self._held, self._pending = buf[at:], ""
                return self._emit(buf[:at])
        keep = max((k for o in self.OPENERS for k in range(1, len(o)) if buf.endswith(o[:k])), default=0)
        if not self._sent_any and not buf.strip():
            keep = len(buf)  # only whitespace so far: JSON may still come first
        self._pending = buf[len(buf) - keep:] if keep else ""
        return self._emit(buf[:len(buf) - keep] if keep else buf)

    def _emit(self, text: str) -> str:
        if text.strip():
            self._sent_any = True
        return text

    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        """(content still to send, calls) once the answer has ended (`truncated`: at max_tokens)."""
        if self._held is None:
            return self._pending, []
        content, calls = parse_output(self._held, self.tools, truncated)
        if not calls:
            return self._pending + self._held, []
        return content or "", calls if self.parallel else calls[:1]
