"""prepare() records a run durably, or leaves its files to the one who starts it.

`treb run` attached leaves the fsyncs of the run's files to the local supervisor, which
does them while its cgroup move waits (off the launch's serial path): the list it is given
must hold every file prepare wrote, complete, and nothing may be left unsynced when the run
is not taken over (runner.start syncs then).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import write_spec
from trebuchet.launcher.submit import prepare
from trebuchet.spec.load import load_spec
from trebuchet.store.db import Store

FILES = ["snapshot.json", "snapshot-files.json", "spec.yaml", "spec.json", "metrics.json"]


def _loaded(tmp_path: Path):
    return load_spec(write_spec(tmp_path, "command: [python, t.py]\n"))


def test_a_durable_prepare_leaves_nothing_unsynced(tmp_path: Path) -> None:
    sub = prepare(_loaded(tmp_path), "local", Store())
    assert sub.unsynced == []
    assert sorted(p.name for p in sub.run_dir.iterdir() if p.is_file()) == sorted(
        [*FILES, "events.jsonl"]
    )


def test_a_deferred_prepare_lists_every_file_it_wrote_and_sync_empties_it(
    tmp_path: Path,
) -> None:
    sub = prepare(_loaded(tmp_path), "local", Store(), durable=False)
    assert [Path(p).name for p in sub.unsynced] == FILES
    for path in sub.unsynced:
        text = Path(path).read_text()
        assert text  # complete before any fsync: written, then renamed
        if path.endswith(".json"):
            json.loads(text)
    sub.sync()
    assert sub.unsynced == []
    sub.sync()  # twice: nothing left to do
