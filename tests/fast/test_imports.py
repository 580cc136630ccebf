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
    assert heavy_modules("import trebuchet.cli.supervise, trebuchet.launcher.supervisor") == []


def test_ps_and_help_import_only_what_they_need(tmp_path) -> None:
    import os

    env = {**os.environ, "TREB_HOME": str(tmp_path)}
    body = "from trebuchet.cli.main import main\nmain(['ps'])"
    assert heavy_modules(body, env) == []
    body = "from trebuchet.cli.main import build_parser\nbuild_parser().format_help()"
    assert heavy_modules(body, env) == []


def test_ps_refreshing_active_runs_imports_no_pydantic(tmp_path) -> None:
    """`treb ps` with active local and Slurm runs loads those engines, and only them."""
    import os

    from trebuchet.store.db import RunRecord, Store

    env = {**os.environ, "TREB_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # no squeue
    os.environ["TREB_HOME"] = env["TREB_HOME"]
    try:
        store = Store()
        for i, engine in enumerate(("local", "slurm")):
            store.insert_run(RunRecord(
                id=f"{i:08x}", name="x", backend=engine, launcher="native", state="RUNNING",
                nodes=1, procs_per_node=1, run_dir=str(tmp_path / str(i)), created_at=1.0,
                host="elsewhere", backend_id="12" if engine == "slurm" else None,
            ))  # fmt: skip
        store.close()
    finally:
        del os.environ["TREB_HOME"]
    body = (
        "from trebuchet.cli.main import main\nmain(['ps'])\n"
        "assert 'trebuchet.backends.local.engine' in sys.modules, 'local runs were not refreshed'\n"
        "assert 'trebuchet.backends.kubernetes.engine' not in sys.modules"
    )
    assert heavy_modules(body, env) == []


def test_run_path_never_imports_torch() -> None:
    assert "torch" not in heavy_modules(
        "import trebuchet.cli.run_cmd, trebuchet.backends.local.engine"
    )
