"""A chat template's tool-call format, and the conversation prepared for it (pure; the engine renders it).

Formats, chosen from the GGUF's chat template as llama-server's --jinja mode does:
  hermes   Qwen 2.5/3, Hermes 2 Pro and others: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  qwen3_coder  Qwen3-Coder: <tool_call><function=NAME><parameter=KEY>raw value</parameter></function></tool_call>
  glm45    GLM 4.5 and later: <tool_call>NAME<arg_key>KEY</arg_key><arg_value>raw value</arg_value></tool_call>
  llama3   Llama 3.1-3.3: {"name": ..., "parameters": {...}}, optionally after <|python_tag|>
  mistral  Mistral/Nemo: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
  harmony  gpt-oss (OpenAI's harmony channels): a call is a commentary message to=functions.NAME with JSON
           arguments; the engine rewrites the channels as it streams (engine/harmony.py): reasoning as a think block,
           a call as a Hermes one, so the readers of those read them
  deepseek_v31  DeepSeek V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
           <｜tool▁calls▁end｜>; its template lists no tools, so they are described in the system message (in the
           words of DeepSeek's own tool prompt)
  generic  any other template (SmolLM2's ChatML included): the tools are described in the system message and
           the model answers {"tool_calls": [{"name": ..., "arguments": {...}}]}
The serving side (serving/tool_calls.py) builds the grammar and parses answers for the same formats.
"""

from __future__ import annotations

import json
import re

FORMATS = ("hermes", "qwen3_coder", "glm45", "llama3", "mistral", "deepseek_v31", "harmony", "generic")
HARMONY_MARKERS = ("<|channel|>", "<|start|>", "<|message|>")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
MISTRAL_OPEN = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


def template_format(template: str) -> str:
    if all(marker in template for marker in HARMONY_MARKERS):
        return "harmony"
    # DeepSeek V3.1 writes NAME<｜tool▁sep｜>arguments; R1's older templates write a type and a ```json block there
    # (not read: they stay generic).
    if DS_CALL_BEGIN in template and DS_SEP in template and "```json" not in template:
        return "deepseek_v31"
    if "<function=" in template and "<parameter=" in template:  # inside <tool_call> too: before Hermes
        return "qwen3_coder"
    if "<arg_key>" in template:
        return "glm45"
    if HERMES_OPEN in template:
        return "hermes"
    if MISTRAL_OPEN in template:
        return "mistral"
    if PYTHON_TAG in template or ("<|start_header_id|>" in template and "tools" in template):
        return "llama3"
    return "generic"


def generic_instructions(functions: list[dict], parallel: bool) -> str:
    """The system text that teaches a template without tool support to call tools (the generic format)."""
    many = "one or more calls" if parallel else "exactly one call"
    return ("You can call these tools (JSON Schema for each one's arguments):\n"
            + json.dumps(functions, ensure_ascii=False) + "\n"
            "To call tools, answer with only this JSON and nothing else, with " + many + ":\n"
            '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}\n'
            "Otherwise answer the user normally.")


def deepseek_instructions(functions: list[dict]) -> str:
    """The system text that describes the tools to DeepSeek V3.1, whose template lists none: the shape of
    DeepSeek's published tool prompt (each tool's name, description and parameters, then the call format)."""
    parts = ["## Tools", "You have access to the following tools:"]
    for f in functions:
        parts += [f"\n### {f['name']}", f"Description: {f.get('description') or ''}",
                  f"\nParameters: {json.dumps(f.get('parameters') or {'type': 'object'}, ensure_ascii=False)}"]
    parts += ["\nIMPORTANT: ALWAYS adhere to this exact format for tool use:",
              f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}tool_call_name{DS_SEP}tool_call_arguments{DS_CALL_END}"
              f"{{{{additional_tool_calls}}}}{DS_CALLS_END}",
              "\nWhere:",
              "- `tool_call_name` must be an exact match to one of the available tools",
              "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema",
              "- For multiple tool calls, chain them directly without separators or spaces"]
    return "\n".join(parts)


# A template that joins a call's arguments into its text with `+` (DeepSeek V3.1's own) needs them as the JSON
# string; one that writes them with `| tojson` (most, and llama.cpp's edited copy of DeepSeek's) as an object.
_JOINS_ARGUMENTS = re.compile(r"""(\[['"]arguments['"]\]|\.arguments)\s*\+""")


def wants_argument_text(template: str) -> bool:
    return bool(_JOINS_ARGUMENTS.search(template or ""))


def _arguments(text):
    """A call's arguments as the templates want them (an object; HF's convention), from the wire's string."""
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _arguments_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def prepare(messages: list[dict], fmt: str, tools: list[dict] | None, parallel: bool = True,
            argument_text: bool = False) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) to render with the template. Templates that know tools get them, with assistant calls'
    arguments as objects (as JSON text where `argument_text`: wants_argument_text) and tool results as 'tool'
    messages; the generic format writes both into the text."""
    names = {c.get("id"): c.get("function", {}).get("name")
             for m in messages for c in (m.get("tool_calls") or [])}
    out: list[dict] = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            convert = _arguments_text if argument_text else _arguments
            calls = [{"id": c.get("id"), "type": "function",
                      "function": {"name": c["function"]["name"], "arguments": convert(c["function"]["arguments"])}}
                     for c in m["tool_calls"]]
            if fmt == "generic":
                text = json.dumps({"tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                                  for c in calls]}, ensure_ascii=False)
                m = {"role": "assistant", "content": ((m.get("content") or "") + "\n" + text).strip()}
            else:
                m["tool_calls"] = calls
                m["content"] = m.get("content") or ""
        elif m.get("role") == "tool":
            name = names.get(m.get("tool_call_id"))
            if fmt == "generic":
                m = {"role": "user", "content": json.dumps({"tool_response": {
                    "tool_call_id": m.get("tool_call_id"), "name": name, "content": m.get("content")}},
                    ensure_ascii=False)}
            elif name:
                m["name"] = name
        out.append(m)
    if not tools:
        return out, None
    if fmt == "harmony":  # its template writes each tool's description as text: one is needed, if empty
        return out, [{**t, "function": {**t["function"], "description": t["function"].get("description") or ""}}
                     for t in tools]
    if fmt not in ("generic", "deepseek_v31"):
        return out, tools
    functions = [t["function"] for t in tools]
    text = deepseek_instructions(functions) if fmt == "deepseek_v31" else generic_instructions(functions, parallel)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out, None
