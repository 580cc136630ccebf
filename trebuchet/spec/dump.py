"""YAML as people write it: block style, keys in the given order, multi-line strings as
literal blocks (`|`). Used by the importers (a spec) and the Kubernetes render (manifests)."""

from __future__ import annotations

from typing import Any

import yaml


class BlockDumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if "\n" in value and not any(line != line.rstrip() for line in value.split("\n")):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


BlockDumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    """Block-style YAML, keys in the given order, multi-line strings as literal blocks."""
    return yaml.dump(data, Dumper=BlockDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=1000)  # fmt: skip
