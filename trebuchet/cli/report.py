"""Texts shown about a run: the end-of-run summary, the tail of the failing log, and the
diagnosis (cause and fix) of a run that did not succeed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trebuchet.launcher.outputs import lines as output_lines
from trebuchet.runtime.watch.display_lines import shown
from trebuchet.spec.duration import human
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.states import describe_failure

TAIL_LINES = 15
NOT_OK = ("FAILED", "TIMEOUT", "LOST", "CANCELLED")


def _diagnosis(store: Store | None, rec: RunRecord) -> Any:
    """The run's Diagnosis when it did not succeed (or has a failure already), else None."""
    if rec.state not in NOT_OK and not rec.first_failure:
        return None
    from trebuchet.diagnose.report import diagnose_record

    return diagnose_record(store, rec)


def diagnosis_lines(store: Store | None, rec: RunRecord) -> list[str]:
    """'cause: ...' and 'fix: ...'; a log diagnosis cannot read never hides the rest."""
    try:
        d = _diagnosis(store, rec)
    except Exception as exc:  # noqa: BLE001 - status and run summaries must still print
        return [f"diagnosis unavailable: {exc!r}"]
    if d is None:
        return []
    from trebuchet.diagnose.report import two_lines

    return two_lines(d)


def diagnosis_json(store: Store | None, rec: RunRecord) -> dict[str, Any] | None:
    """{"root_cause": ..., "ranks": [...]} for `treb status --json` (None when it succeeded)."""
    try:
        d = _diagnosis(store, rec)
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc)}
    return None if d is None else d.to_json()


def tail_text(path: Path, lines: int = TAIL_LINES) -> list[str]:
    from trebuchet.runtime.rundir.regular import open_regular

    try:
        with open_regular(path) as fh:  # a rank's FIFO never freezes the summary
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode(errors="replace")
    except OSError:
        return []
    found = [shown(ln, tab=True) for ln in data.replace("\r", "\n").split("\n") if ln.strip()]
    return found[-lines:]


# The summary's colours (SGR), only on a terminal and never under NO_COLOR (no-color.org):
# plain codes, not rich, whose import would cost every attached run ~50 ms at its end.
RED, GREEN, YELLOW, BOLD, RESET = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[1m", "\x1b[0m"
STATE_COLOURS = {"SUCCEEDED": GREEN, "FAILED": RED, "TIMEOUT": RED, "LOST": RED,
                 "CANCELLED": YELLOW}  # fmt: skip
LABEL_COLOURS = {"cause:": RED, "fix:": GREEN, "error:": RED}
INDENT = "  "


def colour_wanted(stream: Any) -> bool:
    """Colour on `stream`: a terminal, NO_COLOR unset or empty, TERM not dumb."""
    import os

    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _paint(text: str, colour: str) -> str:
    return f"{BOLD}{colour}{text}{RESET}"


def final_summary(store: Store, rec: RunRecord, colour: bool = False) -> str:
    """The end of an attached run: one `treb:` line with the final state, then what
    explains it, indented (the cause and its fix without a `treb:` before each line).
    Every line is shown as text first (it quotes the ranks' output); colour after."""
    head = f"treb: run {rec.id} ({rec.name}) {rec.state} after {human(rec.duration)}"
    if rec.max_attempts > 1 or rec.attempt:
        head += f", attempt {rec.attempt + 1} of {rec.max_attempts}"
    out: list[str] = []
    if rec.first_failure:
        ff = rec.first_failure
        stopped = [p for p in store.procs(rec.id, ff.get("attempt")) if p["stopped_by_launcher"]]
        out.append(f"first failure: {describe_failure(ff)}")
        if stopped:
            out.append(f"{len(stopped)} other process(es) were stopped by the launcher after it")
        log = ff.get("log")
        if log:
            from trebuchet.diagnose.codepaths import CodeMap  # a failure's: filecmp, the map

            tail = tail_text(Path(log))
            code = CodeMap.for_run(rec.run_dir)  # tracebacks name the user's files
            tail = code.lines(tail) if code else tail
            if tail:
                out.append(f"last lines of {log}:")
                out += [f"  {line}" for line in tail]
    elif rec.state != "SUCCEEDED":
        out.append(f"see `treb status {rec.id}` and `treb logs {rec.id}`")
    out += goodput_lines(rec)
    out += straggler_lines(rec)
    out += diagnosis_lines(store, rec)
    out += results_lines(store, rec)
    out += metrics_lines(store, rec)
    out += output_lines(rec.run_dir)  # in the code snapshot
    text = [shown(head, tab=True)] + [INDENT + shown(line, tab=True) for line in out]
    if not colour:
        return "\n".join(text)
    painted = _paint(rec.state, STATE_COLOURS.get(rec.state, ""))
    text[0] = text[0].replace(f" {rec.state} after ", f" {painted} after ", 1)
    for i, line in enumerate(text[1:], 1):
        label = line[len(INDENT) :].split(" ", 1)[0]
        if label in LABEL_COLOURS:
            text[i] = (
                INDENT + _paint(label, LABEL_COLOURS[label]) + line[len(INDENT) + len(label) :]
            )
    return "\n".join(text)


def goodput_lines(rec: RunRecord) -> list[str]:
    """'goodput 91 %: 4m restarts, 2m redone' (docs/goodput.md); a run whose records
    cannot be read never hides the rest."""
    try:
        from trebuchet.goodput import line, of_run

        return [line(of_run(rec))]
    except Exception as exc:  # noqa: BLE001 - the run's own outcome must still be reported
        return [f"goodput unavailable: {exc!r}"]


def goodput_json(rec: RunRecord) -> dict[str, Any] | None:
    try:
        from trebuchet.goodput import of_run

        return of_run(rec).to_json()
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc)}


def straggler_json(rec: RunRecord) -> dict[str, Any] | None:
    """The latest attempt's stragglers (runtime/watch/straggler.py, docs/goodput.md): every
    rank's and node's score and those named; None when no two ranks marked steps."""
    try:
        from trebuchet.runtime.watch.straggler import summary

        return summary(rec.run_dir, rec.attempt, rec.procs_per_node,
                       rec.nodes * rec.procs_per_node or None)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a run's records never hide the rest
        return {"error": repr(exc)}


def straggler_lines(rec: RunRecord) -> list[str]:
    """'straggler: rank 1 (node 0, tn1) takes 1.52x its peers' median step time ...'"""
    from trebuchet.runtime.watch.straggler import lines

    data = straggler_json(rec)
    if data and "error" in data:
        return [f"stragglers unavailable: {data['error']}"]
    return lines(data)


def metrics_lines(store: Store, rec: RunRecord) -> list[str]:
    """Ingests the run's metrics and names their last values ('metrics: loss 0.11 ...')."""
    try:
        from trebuchet.cli.metrics_cmd import number
        from trebuchet.store.metrics import dropped, dropped_lines, ingest, latest

        ingest(store, rec)
        last = latest(store, rec.id)
        notes = [f"metrics: {line}" for line in dropped_lines(dropped(store, rec.id))]
    except Exception as exc:  # noqa: BLE001 - the run's own outcome must still be reported
        return [f"metrics not recorded: {exc!r}"]
    if not last:
        return notes
    named = ", ".join(f"{k} {number(v['value'])}" for k, v in list(last.items())[:6])
    more = f" and {len(last) - 6} more" if len(last) > 6 else ""
    return [f"metrics: {named}{more} (`treb metrics {rec.id}`)", *notes]


def results_lines(store: Store, rec: RunRecord) -> list[str]:
    """Records the finished run's results and says what was found ('performance: ...')."""
    try:
        from trebuchet.results.collect import collect
        from trebuchet.results.perfcsv import number

        rows = collect(store, rec)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome must still be reported
        return [f"results not recorded: {exc!r}"]
    found = [r for r in rows if r.get("performance") is not None and r["status"] == "SUCCESS"]
    lines = [f"performance: {number(r['performance'])} {r['metric']} ({r['model']}, {r['source']})"
             for r in found[:3]]  # fmt: skip
    if len(found) > 3:
        lines.append(f"... {len(found) - 3} more result row(s): `treb results {rec.id}`")
    return lines


def attached_end(store: Store, result: Any, run_dir: Path, profile: str) -> int:
    """The end of an attached `treb run` (in the CLI, or in the local supervisor that took
    the process over): the summary, where profiles went, and the exit status."""
    import sys

    from trebuchet.runner import exit_code

    rec = store.get(result.run_id)
    if rec is not None:
        print(final_summary(store, rec, colour_wanted(sys.stderr)), file=sys.stderr)
    if profile != "none":
        print(f"treb: profiles ({profile}) in {run_dir / 'profile'}", file=sys.stderr)
    return exit_code(result)
