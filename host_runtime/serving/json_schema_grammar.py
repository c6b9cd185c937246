"""The JSON grammars a request can ask for (pure): a JSON Schema's, from llama-cpp-python's converter, and any
JSON object's (response_format json_object, llama-cpp-python's JSON_GBNF), with a string's characters held to
what JSON and Unicode allow; and that class of characters for the other grammars that hold text (tool_calls_xml).

llama.cpp's grammar decodes a token's bytes without checking them: a byte sequence that is not UTF-8 but has the
shape of one (a lead byte past F4, an encoded surrogate) passes as one "character" and comes out of the API's
UTF-8 decoding as one U+FFFD per byte. Measured: a string held to maxLength 20 by the converter's grammar came back
27 characters long from a random-weight model (tests/test_tool_calls.py). The libraries' classes exclude only a
quote, a backslash and controls; here the code points no UTF-8 can encode are excluded too. (A sequence llama.cpp
cannot read at all decodes as code point 0, which the classes exclude already; an overlong encoding, C0 A0 for a
space, decodes to an allowed value and is not caught: no character class can tell it.)
"""

from __future__ import annotations

import json

# Code points that are not Unicode scalar values: surrogates, and past U+10FFFF (up to what llama.cpp's decoder
# can make of a 4-byte lead byte).
NOT_SCALAR = r"\uD800-\uDFFF\U00110000-\U7FFFFFFF"
# A character of a JSON string written as itself (JSON wants a control escaped).
JSON_STRING_CHAR = rf'[^"\\\x00-\x1F{NOT_SCALAR}]'

# The libraries' own classes, as they write them (llama_grammar.PRIMITIVE_RULES["char"], JSON_GBNF's string).
_CONVERTER_CHAR = r'char ::= [^"\\] | '
_JSON_GBNF_CHAR = r'[^"\\\x7F\x00-\x1F]'


def _replaced(grammar: str, library_class: str, ours: str) -> str:
    if library_class not in grammar:  # a newer llama-cpp-python: the tests say so before a box does
        raise ValueError(f"llama-cpp-python's grammar no longer has {library_class!r} (json_schema_grammar.py)")
    return grammar.replace(library_class, ours)


def schema_grammar(schema: dict) -> str:
    """The grammar of documents valid under `schema`. Raises what the converter raises for what it cannot do."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(json.dumps(schema))
    if "char ::=" not in grammar:  # no string in the schema
        return grammar
    return _replaced(grammar, _CONVERTER_CHAR, f"char ::= {JSON_STRING_CHAR} | ")


def json_object_grammar() -> str:
    """Any JSON object (response_format json_object)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return _replaced(JSON_GBNF, _JSON_GBNF_CHAR, JSON_STRING_CHAR)
