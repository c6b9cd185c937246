"""The API's OpenAPI document (openapi.json): the routes, their responses and the error shapes from
openapi_routes.json (kept by hand, checked against the real routes by tests/test_openapi.py), and every request body's
schema generated from request_models.py, the models that check the bodies.

  .venv/bin/python -m host_runtime.serving.openapi --write    # after a change to either
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic.json_schema import models_json_schema

from host_runtime.serving.request_models import DOCUMENTED

HERE = Path(__file__).parent
ROUTES_FILE = HERE / "openapi_routes.json"
DOCUMENT_FILE = HERE / "openapi.json"
REF = "#/components/schemas/{model}"


def _untitled(node):
    """pydantic's schema without the titles it makes from field names (the document names things itself)."""
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items()
                if not (k == "title" and isinstance(v, str)) and not (k == "default" and v is None)}
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node


def document() -> dict:
    doc = json.loads(ROUTES_FILE.read_text())
    _, generated = models_json_schema([(model, "validation") for model in DOCUMENTED], ref_template=REF)
    schemas = doc["components"]["schemas"]
    for name, schema in generated["$defs"].items():
        if name in schemas:
            raise ValueError(f"{name}: a request model's name is also one of openapi_routes.json's schemas")
        schemas[name] = _untitled(schema)
    return doc


def document_text() -> str:
    return json.dumps(document(), indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="openapi.json, from openapi_routes.json and the request models")
    p.add_argument("--write", action="store_true", help=f"write {DOCUMENT_FILE.name} (else print it)")
    args = p.parse_args(argv)
    if args.write:
        DOCUMENT_FILE.write_text(document_text())
    else:
        sys.stdout.write(document_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
