"""A file generated from typed models (box.toml's JSON Schema, the API's OpenAPI document): pydantic's schema
made readable, and the small command that prints or writes the file. A test compares each committed file with what
its generator makes, so the two cannot drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable


def readable_schema(node, defs: dict | None = None):
    """pydantic's JSON Schema without the titles it makes from names and its null defaults (an absent field is not
    null in TOML or JSON here), each $ref replaced by its definition where `defs` are given."""
    if isinstance(node, dict):
        if defs is not None and "$ref" in node:
            return readable_schema(defs[node["$ref"].rsplit("/", 1)[1]], defs)
        return {k: readable_schema(v, defs) for k, v in node.items()
                if not (k == "title" and isinstance(v, str)) and not (k == "default" and v is None)
                and not (defs is not None and k == "$defs")}
    if isinstance(node, list):
        return [readable_schema(v, defs) for v in node]
    return node


def main(argv, target: Path, text: Callable[[], str], description: str) -> int:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--write", action="store_true", help=f"write {target.name} (else print it)")
    args = p.parse_args(argv)
    if args.write:
        target.write_text(text())
    else:
        sys.stdout.write(text())
    return 0
