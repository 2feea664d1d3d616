"""The JSON schemas' validators."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def schema(name: str) -> dict:
    document = json.loads((SCHEMAS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator that resolves references between the files of schemas/."""
    from referencing import Registry, Resource

    resources = [
        (f"rollout-diag/{path.name}", Resource.from_contents(json.loads(path.read_text())))
        for path in SCHEMAS.glob("*.json")
    ]
    return jsonschema.Draft202012Validator(schema(name), registry=Registry().with_resources(resources))
