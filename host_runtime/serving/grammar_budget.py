"""What turning a request's JSON Schemas into a grammar may cost, bounded before anything is converted (pure).

llama-cpp-python's converter writes a bounded repetition out in full: `(a){1000}` (9 characters of pattern)
becomes a thousand references to the group's rule, and `"maxItems": 1000` a thousand references to the item's
rule. A request of a few kilobytes could so make a grammar of tens of megabytes, in the HTTP worker, on the
engine's socket and in the engine. Every schema a request carries (`response_format`, each tool's parameters, an
Anthropic `input_schema` or `output_config.format`) is weighed here first: its nesting, each repetition, each
pattern's length, and an estimate of the grammar's bytes (`schema_weight`), against a budget shared by the whole
request. What passes converts in milliseconds; the grammar made is then capped by its real size as well.
"""

from __future__ import annotations

import re

from host_runtime.engine.wire import MAX_GRAMMAR_BYTES
from host_runtime.serving.errors import APIError

MAX_SCHEMA_DEPTH = 16
# llama.cpp refuses repetitions past 2000 (and the converter nests one rule per repetition).
MAX_SCHEMA_REPETITION = 1000
MAX_PATTERN_LENGTH = 4096
REPETITION_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
# The grammar one request's schemas may make, estimated before converting (tools and response_format together).
# An agent's dozen tools weigh about 15 KiB; the budget is a few times the largest grammar allowed below.
MAX_REQUEST_WEIGHT = 1 << 20
# The grammar made, measured: response_format's (one schema) and the tools' (all tools in one grammar).
MAX_SCHEMA_GRAMMAR_BYTES = 64 * 1024
MAX_TOOLS_GRAMMAR_BYTES = MAX_GRAMMAR_BYTES  # all a grammar may be: the engine's own ceiling (engine/wire.py)
# A rule name the converter writes where a repetition refers to an item, beyond the property path it is named
# after; a repetition's item costs at least this.
RULE_NAME_BYTES = 8

_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def pattern_weight(pattern: str, rule_name_bytes: int, path: str) -> int:
    """About how many bytes of grammar the converter writes for `pattern`: each character once, and each bounded
    repetition ({n}, {n,m}, {n,}) its item max(n, m) times over: a group as a reference to the group's rule, a
    character class or an escape as its own text. Refuses a repetition past MAX_SCHEMA_REPETITION."""
    weight, i, item = 0, 0, 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            item, i = 2, i + 2
        elif c == "[":
            j = i + 1
            if pattern.startswith("^", j):
                j += 1
            if pattern.startswith("]", j):
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            item, i = j + 1 - i, j + 1
        elif c == ")":
            item, i = rule_name_bytes, i + 1
        elif c == "{" and (m := _QUANTIFIER.match(pattern, i)):
            low, high = int(m.group(1)), m.group(2)
            if high is None:        # {n}
                times = low
            elif high == "":        # {n,}: n written out, then a star
                times = low + 1
            else:                   # {n,m}
                times = max(low, int(high))
            if times > MAX_SCHEMA_REPETITION:
                raise _bad(f"'pattern' repeats {times} times; this server allows at most {MAX_SCHEMA_REPETITION}",
                           f"{path}.pattern")
            # An optional repetition nests: (a (a (a)?)?)?, three bytes of brackets each.
            weight += times * (item + 3)
            item, i = 0, m.end()
            continue
        else:
            item, i = 1, i + 1
        weight += 1
    return weight


def schema_weight(schema, path: str, depth: int = 0, name_bytes: int = 0) -> int:
    """The schema's limits checked (nesting, repetitions, pattern length), and the grammar's bytes it would make,
    estimated: every key and value once, and each repetition its item's rule name (named after the property path,
    `name_bytes` long here) as often as it repeats."""
    if depth > MAX_SCHEMA_DEPTH:
        raise _bad(f"the JSON Schema nests deeper than {MAX_SCHEMA_DEPTH} levels", path)
    if isinstance(schema, dict):
        weight = 24  # a rule of its own, or a key-value rule in its parent
        for keyword in REPETITION_KEYWORDS:
            value = schema.get(keyword)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _bad(f"'{keyword}' must be a non-negative integer", f"{path}.{keyword}")
            if value > MAX_SCHEMA_REPETITION:
                raise _bad(f"'{keyword}' is {value}; this server allows at most {MAX_SCHEMA_REPETITION}",
                           f"{path}.{keyword}")
            weight += value * (name_bytes + RULE_NAME_BYTES)
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            if len(pattern) > MAX_PATTERN_LENGTH:
                raise _bad(f"'pattern' is {len(pattern)} characters long; this server allows at most "
                           f"{MAX_PATTERN_LENGTH}", f"{path}.pattern")
            weight += pattern_weight(pattern, name_bytes + RULE_NAME_BYTES, path)
        for key, value in schema.items():
            weight += len(str(key)) + 4
            if isinstance(value, (dict, list)):
                # Properties name their rules after themselves: the names grow with the path.
                weight += _children_weight(value, path, depth, name_bytes, key == "properties")
            elif isinstance(value, str) and key != "pattern":
                weight += len(value) + 2
            else:
                weight += 8
        return weight
    if isinstance(schema, list):
        return _children_weight(schema, path, depth, name_bytes, False)
    return len(str(schema)) + 2


def _children_weight(value, path: str, depth: int, name_bytes: int, properties: bool) -> int:
    if isinstance(value, dict):
        if properties:
            return sum(len(str(k)) + schema_weight(v, path, depth + 1, name_bytes + len(str(k)) + 1)
                       for k, v in value.items())
        return schema_weight(value, path, depth + 1, name_bytes + 2)
    return sum(schema_weight(v, path, depth + 1, name_bytes + 2) for v in value)  # anyOf's: root-1, root-2...


class GrammarBudget:
    """The estimated grammar bytes one request's schemas may make, all of them together."""

    def __init__(self, limit: int = MAX_REQUEST_WEIGHT):
        self.limit = limit
        self.used = 0

    def charge(self, schema, path: str, name_bytes: int = 0) -> None:
        """Weigh `schema` (its limits checked on the way) and count it; refuse once the request is over budget."""
        self.used += schema_weight(schema, path, name_bytes=name_bytes)
        if self.used > self.limit:
            raise _bad(f"the JSON Schemas of this request would make a grammar of about {self.used // 1024} KiB; "
                       f"this server allows about {self.limit // 1024} KiB (fewer or smaller schemas, fewer "
                       f"or shorter repetitions)", path)


def check_grammar_size(grammar: str, limit: int, param: str, what: str) -> str:
    """The grammar made, refused past `limit` bytes."""
    if len(grammar) > limit:
        raise _bad(f"{what} makes a grammar of {len(grammar)} bytes; the limit is {limit}", param)
    return grammar
