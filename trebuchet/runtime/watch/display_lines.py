"""Rank output -> display lines: linear in the input, bounded, and inert on a terminal.

Lines end at \\n or \\r (each state of a progress bar is a line); with `redraw` (the live
view) \\r overwrites, so a 1,000-step bar is a few lines. Each byte is searched for a line
end once and a partial line is kept in pieces: a rank writing megabytes without a newline
costs what it writes, not its square. Controls are shown `cat -v` style and separators and
bidi controls as `\\u202e`, so a rank can neither move the cursor nor reorder what the
terminal shows. The log files themselves keep exactly what was written.
"""

from __future__ import annotations

import re

CAP = 64 * 1024
CUT = b" [treb: line continues]"
# C0 but \t \n \r, DEL, C1 (UTF-8: C2 80-9F), and as UTF-8 U+2028/U+2029 and the bidi
# controls U+202A-U+202E (E2 80 A8-AE) and U+2066-U+2069 (E2 81 A6-A9).
_CONTROL = re.compile(
    rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]"
)


def _caret(m: re.Match[bytes]) -> bytes:
    b = m.group()
    if len(b) == 3:  # a separator or bidi control: as `shown` writes it (\u202e)
        return b"\\u%04x" % ord(b.decode())
    if len(b) == 2:  # C1, e.g. U+009B (a one-character CSI)
        return b"M-^" + bytes([b[1] - 0x80 + 64])
    return b"^?" if b == b"\x7f" else b"^" + bytes([b[0] + 64])


# bytes.translate (~0.3 ms a MiB) tells whether the substitution (~15 ms a MiB) has
# anything to do; the three-byte ones are searched only where an E2 is.
_C0 = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
_SEPARATORS = re.compile(rb"\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def inert(data: bytes) -> bytes:
    if (b"\xc2" not in data and len(data.translate(None, _C0)) == len(data)
            and (b"\xe2" not in data or not _SEPARATORS.search(data))):  # fmt: skip
        return data
    return _CONTROL.sub(_caret, data)


# What a terminal acts on or cannot show, in a str: C0 (\t and \n too: a field is one
# line), DEL, C1, the line/paragraph separators, the bidi overrides, lone surrogates.
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _shown_char(m: re.Match[str]) -> str:
    o = ord(m.group())
    if o < 0x20:
        return "^" + chr(o + 64)
    if o == 0x7F:
        return "^?"
    if o < 0xA0:
        return "M-^" + chr(o - 0x80 + 64)
    return f"\\u{o:04x}"


def shown(text: str, tab: bool = False) -> str:
    """Text a program wrote as one line a terminal shows as text and UTF-8 encodes (lone
    surrogates too): the one place the views make text safe; idempotent."""
    if text.isprintable():  # the common case: a C-speed check (controls, Zl, Cs, Cf fail)
        return text
    if tab:
        return "\t".join(_UNSHOWN.sub(_shown_char, part) for part in text.split("\t"))
    return _UNSHOWN.sub(_shown_char, text)


class Splitter:
    def __init__(self, cap: int = CAP, redraw: bool = False) -> None:
        self.cap = cap
        self.redraw = redraw
        self.partial: list[bytes] = []
        self.partial_len = 0
        self.state = b""  # redraw: the latest state a \r ended, not shown yet
        self.searched = 0  # bytes searched for a line end: each byte once

    @property
    def pending(self) -> bool:
        return bool(self.partial_len or self.state)

    def feed(self, data: bytes) -> list[bytes]:
        if self.redraw:
            return self._feed_redraw(data)
        self.searched += len(data)
        end = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if end < 0:
            self.partial.append(data)
            self.partial_len += len(data)
            return self._cut_partial() if self.partial_len > self.cap else []
        head = b"".join([*self.partial, data[:end]]) if self.partial else data[:end]
        rest = data[end + 1 :]
        self.partial = [rest] if rest else []
        self.partial_len = len(rest)
        lines = list(filter(None, inert(head.replace(b"\r", b"\n")).split(b"\n")))
        if max(map(len, lines), default=0) > self.cap:
            lines = [piece for ln in lines for piece in self._pieces(ln)]
        if self.partial_len > self.cap:
            lines += self._cut_partial()
        return lines

    def _feed_redraw(self, data: bytes) -> list[bytes]:
        """Each line ended by \\n shows its last non-empty \\r-segment (\\r\\n: a plain end)."""
        self.searched += len(data)
        lines: list[bytes] = []
        end = data.rfind(b"\n")
        if end >= 0:
            head = b"".join([*self.partial, data[:end]]) if self.partial else data[:end]
            data = data[end + 1 :]
            self.partial, self.partial_len = [], 0
            for i, ln in enumerate(head.split(b"\n")):
                shown = _last_state(ln) or (self.state if i == 0 else b"")
                if shown:
                    lines += self._pieces(inert(shown))
            self.state = b""
        cr = data.rfind(b"\r")
        if cr >= 0:
            seg = _last_state(b"".join([*self.partial, data[:cr]]))
            self.state = seg[-self.cap :] if seg else self.state
            data = data[cr + 1 :]
            self.partial, self.partial_len = [], 0
        if data:
            self.partial.append(data)
            self.partial_len += len(data)
        if self.partial_len > self.cap:
            lines += self._cut_partial()
        return lines

    def flush(self) -> list[bytes]:
        if not self.partial_len:
            self.partial = []
            state, self.state = self.state, b""
            return self._pieces(inert(state)) if state else []
        line = inert(b"".join(self.partial))
        self.reset()
        return self._pieces(line)

    def reset(self) -> None:
        self.partial = []
        self.partial_len = 0
        self.state = b""

    def _cut_partial(self) -> list[bytes]:
        buf = b"".join(self.partial)
        whole = (len(buf) - 1) // self.cap * self.cap
        rest = buf[whole:]
        self.partial = [rest] if rest else []
        self.partial_len = len(rest)
        return [inert(buf[i : i + self.cap]) + CUT for i in range(0, whole, self.cap)]

    def _pieces(self, line: bytes) -> list[bytes]:
        if len(line) <= self.cap:
            return [line]
        n = range(0, len(line), self.cap)
        return [line[i : i + self.cap] + (CUT if i + self.cap < len(line) else b"") for i in n]


def _last_state(line: bytes) -> bytes:
    for seg in reversed(line.split(b"\r")):
        if seg:
            return seg
    return b""
