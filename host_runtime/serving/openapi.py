"""The API's OpenAPI document (openapi.json): the routes, their responses and the error shapes from
openapi_routes.json (kept by hand, checked against the real routes by tests/test_openapi.py), and every request body's
schema generated from request_models.py, the models that check the bodies.

  .venv/bin/python -m host_runtime.serving.openapi --write    # after a change to either
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic.json_schema import models_json_schema

from host_runtime.common import generated_file
from host_runtime.common.generated_file import readable_schema
from host_runtime.serving.request_models import DOCUMENTED

HERE = Path(__file__).parent
ROUTES_FILE = HERE / "openapi_routes.json"
DOCUMENT_FILE = HERE / "openapi.json"
REF = "#/components/schemas/{model}"


def document() -> dict:
    doc = json.loads(ROUTES_FILE.read_text())
    _, generated = models_json_schema([(model, "validation") for model in DOCUMENTED], ref_template=REF)
    schemas = doc["components"]["schemas"]
    for name, schema in generated["$defs"].items():
        if name in schemas:
            raise ValueError(f"{name}: a request model's name is also one of openapi_routes.json's schemas")
        schemas[name] = readable_schema(schema)
    return doc


def document_text() -> str:
    return json.dumps(document(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.exit(generated_file.main(None, DOCUMENT_FILE, document_text,
                                 "openapi.json, from openapi_routes.json and the request models"))
