"""What surrounds the main srun on its statement, as the script wrote it: its simple
commands, each with its words, redirections and the operator after it, so that
`timeout 3600 srun ...; echo rc=$?` or `srun ... > train.log 2>&1` are carried or named,
never dropped silently. bash already ran it; this only splits the text in one pass, skipping
quotes, `$(...)`, backticks, `${...}`, comments and here-documents whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OPERATORS = ("&&", "||", ";;", "|&", ";", "|", "&", "\n")
REDIRECTS = ("&>>", "&>", "<<<", "<<-", "<<", ">>", ">|", ">&", "<&", "<>", ">", "<")
RESERVED = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}",
            "(", ")", "esac", "time"}  # fmt: skip
_PLAIN = re.compile(r"[^\s\\#;&|<>\"'`$()]+")  # what no rule below acts on
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


@dataclass
class Simple:
    """One simple command: its words and redirections as written, the operator after it."""

    words: list[str] = field(default_factory=list)
    redirects: list[str] = field(default_factory=list)
    op: str = ""
    at: int = 0  # where it starts in the text

    @property
    def text(self) -> str:
        return " ".join(self.words + self.redirects)


def _skip(text: str, i: int, closer: str, dq: bool = False) -> int:
    """The index after `closer`, from `i` inside a quote or a `$(`, `${`, `(` group (a
    stack, not recursion: 20k nested `$(` is text like any other)."""
    n = len(text)
    stack = [(closer, dq)]
    while i < n and stack:
        closer, dq = stack[-1]
        c = text[i]
        if c == "\\":
            i += 2
        elif c == closer:
            stack.pop()
            i += 1
        elif c == "'" and not dq:
            i = text.find("'", i + 1) + 1 or n
        elif c in '"`' and not (c == '"' and dq):
            stack.append((c, c == '"' or dq))
            i += 1
        elif text.startswith(("$(", "${"), i):
            stack.append((")" if text[i + 1] == "(" else "}", text[i + 1] == "{"))
            i += 2
        elif c == "(" and not dq:
            stack.append((")", False))
            i += 1
        else:
            i += 1
    return min(i, n)


def split(text: str) -> list[Simple]:
    """The simple commands of `text` in order (reserved words such as `then`/`fi` dropped)."""
    out: list[Simple] = []
    cur = Simple()
    word_start: int | None = None
    heredocs: list[str] = []
    i, n = 0, len(text)

    def end_word(at: int) -> None:
        nonlocal word_start
        if word_start is not None:
            word = text[word_start:at]
            if word not in RESERVED or cur.words:
                cur.words.append(word)
            word_start = None

    def end_simple(op: str) -> None:
        nonlocal cur
        if cur.words or cur.redirects:
            cur.op = op
            out.append(cur)
        cur = Simple()

    while i < n:
        c = text[i]
        if c == "\\" and text.startswith("\n", i + 1):  # a continuation
            end_word(i)
            i += 2
            continue
        if c in " \t":
            end_word(i)
            i += 1
            continue
        if c == "#" and word_start is None:
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        op = next((o for o in OPERATORS if text.startswith(o, i)), None)
        redirect = next((r for r in REDIRECTS if text.startswith(r, i)), None)
        fd = word_start is not None and text[word_start:i].isdigit()
        if redirect and (word_start is None or fd):
            start = word_start if fd and word_start is not None else i
            word_start = None
            if not cur.words and not cur.redirects:
                cur.at = start
            i += len(redirect)
            while i < n and text[i] in " \t":
                i += 1
            target = i
            while i < n and text[i] not in " \t\n;&|<>()":
                if text.startswith(("$(", "${"), i):
                    i = _skip(text, i + 2, ")" if text[i + 1] == "(" else "}")
                else:
                    i = _skip(text, i + 1, text[i]) if text[i] in "\"'`" else i + 1
            cur.redirects.append(text[start:i])
            if redirect in ("<<", "<<-"):
                heredocs.append(re.sub(r"[\"'\\]", "", text[target:i]))
            continue
        if op and not (op == "&" and text.startswith("&>", i)):
            end_word(i)
            end_simple(op.strip() or ";")
            i += len(op)
            if op == "\n" and heredocs:  # the bodies of this line's here-documents
                for delim in heredocs:
                    m = re.compile(r"^\t*" + re.escape(delim) + r"$", re.M).search(text, i)
                    i = m.end() if m else n
                heredocs = []
            continue
        if word_start is None:
            word_start = i
            if not cur.words and not cur.redirects:
                cur.at = i
        plain = _PLAIN.match(text, i)
        if plain:  # ordinary characters: one step (a 900k-character word is one match)
            i = plain.end()
            continue
        if c in "\"'`":
            i = _skip(text, i + 1, c) if c != "'" else (text.find("'", i + 1) + 1 or n)
        elif text.startswith("$(", i):
            i = _skip(text, i + 2, ")")
        elif text.startswith("${", i):
            i = _skip(text, i + 2, "}", True)
        elif c == "\\":
            i += 2
        else:
            i += 1
    end_word(n)
    end_simple("")
    return out


def command_word(s: Simple) -> tuple[int, list[str]]:
    """The index of the word that is the command after assignments and wrappers such as
    `timeout 3600`, `env A=1`, `nohup`, `exec`, and the wrapper words before it."""
    words, i = s.words, 0
    while i < len(words) and ASSIGNMENT.match(words[i]):
        i += 1
    start = i
    while i < len(words):
        w = words[i]
        base = w.rsplit("/", 1)[-1]
        if base == "timeout":
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in ("-s", "-k", "--signal", "--kill-after") else 1
            i += 1  # the duration
        elif base in ("env", "nohup", "exec", "command", "stdbuf", "nice", "numactl",
                      "taskset", "setsid", "chrt", "ionice", "time"):  # fmt: skip
            i += 1
            while i < len(words) and (words[i].startswith("-") or ASSIGNMENT.match(words[i])):
                i += 1
        else:
            break
    i = min(i, len(words))  # `timeout` with no duration: nothing is its command
    return i, words[start:i]
