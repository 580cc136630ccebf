"""Speed rules: the launcher never imports torch; light verbs import no pydantic or rich."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in ("torch", "pydantic", "rich", "yaml") if m in sys.modules)))
"""


def heavy_modules(body: str, env: dict | None = None) -> list[str]:
    res = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True,
                         text=True, check=True, env=env)  # fmt: skip
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_detached_supervisor_imports_neither_torch_nor_pydantic() -> None:
    assert heavy_modules("import trebuchet.launcher.supervisor") == []


def test_ps_and_help_import_only_what_they_need(tmp_path) -> None:
    import os

    env = {**os.environ, "TREB_HOME": str(tmp_path)}
    body = "from trebuchet.cli.main import main\nmain(['ps'])"
    assert heavy_modules(body, env) == []
    body = "from trebuchet.cli.main import build_parser\nbuild_parser().format_help()"
    assert heavy_modules(body, env) == []


def test_run_path_never_imports_torch() -> None:
    assert "torch" not in heavy_modules("import trebuchet.cli.run_cmd, trebuchet.backends.local")
