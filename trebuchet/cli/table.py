"""A plain aligned table for listings that may hold thousands of rows: rich renders 1,000
rows in over a second. Every cell is shown as text (display_lines.shown): a name or a
cause that came from a rank's output never reaches the terminal raw; `markup` does the
same for what rich prints."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from trebuchet.runtime.watch.display_lines import shown

ANSI = {"green": "32", "red": "31", "yellow": "33", "magenta": "35", "cyan": "36", "blue": "34"}


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    colors: Sequence[str | None] | None = None,
) -> None:
    """Print rows aligned under headers; `colors[i]` colours row i's cell under STATE."""
    headers = [shown(h) for h in headers]
    rows = [[shown(str(c)) for c in row] for row in rows]
    widths = [max(map(len, column)) for column in zip(headers, *rows, strict=True)]
    tty = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    state_col = list(headers).index("STATE") if "STATE" in headers else -1
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for n, row in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        color = colors[n] if colors else None
        if tty and color in ANSI and state_col >= 0:
            cells[state_col] = f"\x1b[{ANSI[color]}m{cells[state_col]}\x1b[0m"
        out.append("  ".join(cells).rstrip())
    sys.stdout.write("\n".join(out) + "\n")


def markup(text: object) -> str:
    """`text` for a rich markup string or cell: shown as text, its `[` never markup."""
    from rich.markup import escape

    return escape(shown(str(text)))
