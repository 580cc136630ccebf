"""`treb build`: build (or confirm) the spec's environment now, without running anything."""

from __future__ import annotations

import argparse
import json
import sys

from trebuchet.backends import get_backend
from trebuchet.envs.build import BuildError, ensure
from trebuchet.errors import TrebError, UserError
from trebuchet.spec.load import load_spec
from trebuchet.store.paths import treb_home


def main(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec, args.override)
    engine = get_backend("local")  # built on this machine, whatever --on says (docs/cli.md)
    engine.check(loaded)
    recipe = engine.recipe(loaded)
    if recipe is None:
        raise UserError(f"{loaded.source}: no environment: block; nothing to build")
    log_path = treb_home() / "envs" / f"{recipe.name}.build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        with open(log_path, "a") as log:
            info = ensure(recipe, log)
    except BuildError as exc:
        raise TrebError(f"environment {recipe.name}: {exc}") from None
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    if info.get("kind") == "image":
        print(f"{recipe.name}: image {recipe.image} (pulled by the engine when the run starts)")
    elif info.get("reused"):
        print(f"{recipe.name}: up to date (stamp {recipe.stamp}), checked in "
              f"{info['check_seconds'] * 1000:.0f} ms: {recipe.prefix}")  # fmt: skip
    else:
        print(f"{recipe.name}: built with {recipe.tool} in {info['build_seconds']:.1f} s "
              f"(stamp {recipe.stamp}): {recipe.prefix}")  # fmt: skip
    print(f"build log: {log_path}", file=sys.stderr)
    return 0
