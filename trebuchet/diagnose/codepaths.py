"""Paths into a run's code snapshot (`<run dir>/code/train.py`), shown as the user's own
file (`~/proj/train.py`), which is what an editor opens.

The ranks run the snapshot, so tracebacks name it. A path is mapped only while the user's
file is still the same as the copy that ran (same bytes): once edited, the line numbers
may no longer match, and the snapshot path, where they do, is kept."""

from __future__ import annotations

import filecmp
import re
from pathlib import Path

from trebuchet.runtime.rundir.records import read_json


class CodeMap:
    """Rewrites `<code>/<rel>` to `<source>/<rel>` in text, file by file."""

    def __init__(self, code: str, source: str) -> None:
        self.code, self.source = code.rstrip("/"), source.rstrip("/")
        self.pattern = re.compile(re.escape(self.code) + r"/([^\s\"'(),:]+)")
        self._same: dict[str, bool] = {}

    @property
    def changed(self) -> list[str]:
        """Files named in the text mapped so far that were edited (or removed) since."""
        return sorted(rel for rel, same in self._same.items() if not same)

    @classmethod
    def for_run(cls, run_dir: str | Path | None) -> CodeMap | None:
        """The run's map, from its snapshot.json; None without a snapshot."""
        if not run_dir:
            return None
        facts = read_json(str(Path(run_dir) / "snapshot.json"))  # a rank's FIFO there: None
        if not isinstance(facts, dict):
            return None
        code, source = facts.get("path"), facts.get("source")
        if not isinstance(code, str) or not isinstance(source, str) or code == source:
            return None
        return cls(code, source)

    def _unchanged(self, rel: str) -> bool:
        if rel not in self._same:
            mine, ran = Path(self.source, rel), Path(self.code, rel)
            try:
                self._same[rel] = mine.is_file() and filecmp.cmp(mine, ran, shallow=False)
            except OSError:
                self._same[rel] = False
        return self._same[rel]

    def text(self, text: str) -> str:
        def repl(m: re.Match[str]) -> str:
            rel = m.group(1)
            return f"{self.source}/{rel}" if self._unchanged(rel) else m.group(0)

        return self.pattern.sub(repl, text) if self.code in text else text

    def lines(self, lines: list[str]) -> list[str]:
        return [self.text(line) for line in lines]
