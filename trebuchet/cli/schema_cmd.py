"""`treb schema`: the spec's JSON Schema, for editor completion and validation."""

from __future__ import annotations

import argparse
import json

from trebuchet.spec.model import spec_model


def schema() -> dict:
    data = spec_model().model_json_schema()
    data["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    data["title"] = "trebuchet workload spec"
    # name defaults to the file's stem, so it is not required in a file.
    data["required"] = [r for r in data.get("required", []) if r != "name"]
    return data


def main(args: argparse.Namespace) -> int:
    print(json.dumps(schema(), indent=2))
    return 0
