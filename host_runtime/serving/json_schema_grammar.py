"""A JSON Schema as a GBNF grammar (pure): llama-cpp-python's converter, with a JSON string's characters held to
what JSON and Unicode allow.

The converter's `char` is any code point but a quote or backslash. llama.cpp's grammar decodes a token's bytes
without checking them, so a byte sequence that is not UTF-8 (a lead byte past F4, an encoded surrogate) passes as
one "character" and comes out of the API's UTF-8 decoding as one U+FFFD per byte: a string held to maxLength 20
by the grammar came back 27 characters long (a random-weight model, tests/test_tool_calls.py). Here a string
character is a Unicode scalar value, and no raw control character (JSON wants those escaped). An overlong
encoding (C0 A0 for a space) still decodes to an allowed value and is not caught: no character class can tell it.
"""

from __future__ import annotations

import json

CONVERTER_CHAR = 'char ::= [^"\\\\] | '
SCALAR_CHAR = 'char ::= [^"\\\\\\x00-\\x1F\\uD800-\\uDFFF\\U00110000-\\U7FFFFFFF] | '


def schema_grammar(schema: dict) -> str:
    """The grammar of documents valid under `schema`. Raises what the converter raises for what it cannot do."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(json.dumps(schema))
    return "\n".join(SCALAR_CHAR + line[len(CONVERTER_CHAR):] if line.startswith(CONVERTER_CHAR) else line
                     for line in grammar.split("\n"))
