"""Just enough of bash's grammar to read batch scripts: words, quotes, `$VAR`, operators.

A word keeps its parts (literal text, variable references, command substitutions) with
the quoting each had, so an importer can substitute the script's own variables, undo
`\\$` escapes the way bash does, and write the word back for the node's shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9_.-]*>")
REDIR = re.compile(r"\d*(?:>>|>&|<&|&>|>|<)(?:\d+|-)?")
OPS = ("&&", "||", ";;", "|", ";", "&")
ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")

Resolver = Callable[[str], "str | None"]
Lookup = Callable[[str], "list[Part] | None"]  # a variable's value as parts, or None
BLANKS = re.compile(r"[ \t\n]+")  # bash's default IFS: runs of blanks split fields


@dataclass
class Part:
    kind: str  # "lit", "var" (text = name) or "sub" ($(...) or backticks; text = source)
    text: str
    raw: str = ""  # source of a var/sub, e.g. "${X:-1}"
    quoted: bool = False

    @property
    def plain(self) -> bool:
        """`$X`, `${X}` or `${X:-default}`: the value of X itself, not a transformation of
        it (`${#X}`, `${X%.*}`, `${X:+alt}`...), so a known value may replace it."""
        return self.kind == "var" and (
            self.raw in ("$" + self.text, "${" + self.text + "}")
            or self.raw.startswith(("${" + self.text + ":-", "${" + self.text + "-"))
        )


@dataclass
class Word:
    parts: list[Part]
    raw: str
    line: int
    start: int = 0
    end: int = 0

    def value(self, resolve: Resolver | None = None) -> str:
        """The string bash would pass, with unresolved references kept as written."""
        out = []
        for p in self.parts:
            if p.kind == "lit":
                out.append(p.text)
            elif p.kind == "var":
                got = resolve(p.text) if resolve and p.plain else None
                out.append(p.raw if got is None else got)
            else:
                out.append(p.raw)
        return "".join(out)

    def shell(self, resolve: Resolver | None = None) -> str:
        """Shell source for this word: literals quoted, unresolved references left live."""
        out: list[str] = []
        parts = list(self.parts)
        m = (
            ASSIGN.match(parts[0].text)
            if parts and parts[0].kind == "lit" and not parts[0].quoted
            else None
        )
        if m:  # NAME=value stays an assignment: the name must not be quoted
            out.append(m.group(0))
            rest = parts[0].text[m.end() :]
            parts[0] = Part("lit", rest, quoted=parts[0].quoted)
        lit = ""
        for p in parts:
            got = resolve(p.text) if p.kind == "var" and resolve and p.plain else None
            if p.kind == "lit" or got is not None:
                lit += p.text if got is None else got  # got: a var's value, never a lit's
                continue
            if lit:
                out.append(shlex.quote(lit))
                lit = ""
            out.append(f'"{p.raw}"' if p.quoted else p.raw)
        if lit or not out:
            out.append(shlex.quote(lit))
        return "".join(out)

    def names(self) -> set[str]:
        """Variables this word refers to (including inside command substitutions)."""
        found = {p.text for p in self.parts if p.kind == "var"}
        for p in self.parts:
            if p.kind == "sub":
                found |= set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", p.raw))
        return found

    @property
    def literal(self) -> str | None:
        """The word's text when it has no references at all."""
        return None if any(p.kind != "lit" for p in self.parts) else self.value()


def assigned(word: Word, lookup: Lookup) -> list[Part]:
    """The value of `NAME=value` as parts, the script's known variables substituted (an
    assignment is not split into fields); references nothing resolves stay live."""
    parts = list(word.parts)
    m = ASSIGN.match(parts[0].text) if parts and parts[0].kind == "lit" else None
    if m:
        parts[0] = Part("lit", parts[0].text[m.end() :], quoted=parts[0].quoted)
    out: list[Part] = []
    for p in parts:
        got = lookup(p.text) if p.plain else None
        out.extend([p] if got is None else got)
    return out


def expand(words: list[Word], lookup: Lookup) -> list[Word]:
    """The words bash passes once the script's own variables are substituted: an unquoted
    reference splits into fields at blanks (`$GPT_ARGS` -> one argument per option, as
    Megatron scripts rely on), a quoted one stays one word, an unquoted reference that
    expands to nothing disappears. What `lookup` cannot resolve stays live, for the
    node's shell (which splits it the same way)."""
    out: list[Word] = []
    for w in words:
        fields: list[list[Part]] = [[]]
        for p in w.parts:
            got = lookup(p.text) if p.plain else None
            if got is None:
                fields[-1].append(p)
                continue
            for q in got:
                if q.kind != "lit":  # live inside the value: same quoting as the reference
                    fields[-1].append(Part(q.kind, q.text, q.raw, p.quoted))
                elif p.quoted:
                    fields[-1].append(Part("lit", q.text, quoted=True))
                else:
                    for k, piece in enumerate(BLANKS.split(q.text)):
                        if k:
                            fields.append([])
                        if piece:
                            fields[-1].append(Part("lit", piece, quoted=True))
        kept = [f for f in fields if f]
        if len(kept) == 1 and kept[0] == w.parts:
            out.append(w)
            continue
        for f in kept:
            word = Word(f, "", w.line, w.start, w.end)
            word.raw = word.shell()
            out.append(word)
    return out


@dataclass
class Op:
    text: str
    line: int
    start: int = 0
    end: int = 0


@dataclass
class Command:
    """One simple command: words and redirections, and the operator that ended it."""

    words: list[Word]
    line: int
    raw: str
    end: str = "\n"  # "\n", ";", "&&", "||", "|", "&" or "" at the end of the text
    redirs: list[str] = field(default_factory=list)
    start: int = 0
    stop: int = 0

    @property
    def argv0(self) -> str:
        return self.words[0].value() if self.words else ""


class ShellSyntaxError(ValueError):
    def __init__(self, line: int, why: str) -> None:
        super().__init__(why)
        self.line = line


def _var_end(text: str, i: int) -> tuple[int, str, str] | None:
    """At a `$`: (end index, name, raw) of a reference, or None for a literal `$`."""
    if text.startswith("${", i):
        depth, j = 0, i + 1
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    raw = text[i : j + 1]
                    m = re.match(r"[#!]?([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])", raw[2:])
                    return j + 1, (m.group(1) if m else raw), raw
            j += 1
        return None
    m = NAME.match(text, i + 1)
    if m:
        return m.end(), m.group(0), text[i : m.end()]
    if i + 1 < len(text) and (text[i + 1].isdigit() or text[i + 1] in "@*#?$!-"):
        return i + 2, text[i + 1], text[i : i + 2]
    return None


def _sub_end(text: str, i: int, line: int) -> int:
    """End of `$(...)` whose `$` is at i (quotes inside are skipped)."""
    depth, j, quote = 1, i + 2, ""
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\" and quote == '"':
                j += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            j += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ShellSyntaxError(line, "unterminated $(")


def lex(text: str, first_line: int = 1) -> list[Word | Op]:
    """Words and operators; a newline outside quotes is an Op("\\n"); comments are skipped."""
    out: list[Word | Op] = []
    i, n, line = 0, len(text), first_line
    parts: list[Part] = []
    start = -1
    start_line = line

    def lit(c: str, quoted: bool) -> None:
        if parts and parts[-1].kind == "lit" and parts[-1].quoted == quoted:
            parts[-1].text += c
        else:
            parts.append(Part("lit", c, quoted=quoted))

    def flush(end: int) -> None:
        nonlocal parts, start
        if start >= 0:
            out.append(Word(parts, text[start:end], start_line, start, end))
        parts, start = [], -1

    def begin() -> None:
        nonlocal start, start_line
        if start < 0:
            start, start_line = i, line

    def dollar(quoted: bool) -> None:
        nonlocal i
        if text.startswith("$(", i) and not text.startswith("$((", i):
            end = _sub_end(text, i, line)
            parts.append(Part("sub", text[i:end], text[i:end], quoted))
            i = end
            return
        got = _var_end(text, i)
        if got is None:
            lit("$", quoted)
            i += 1
            return
        end, name, raw = got
        parts.append(Part("var", name, raw, quoted))
        i = end

    while i < n:
        c = text[i]
        if c == "\n":
            flush(i)
            out.append(Op("\n", line, i, i + 1))
            line += 1
            i += 1
        elif c in " \t\r":
            flush(i)
            i += 1
        elif c == "#" and start < 0:
            while i < n and text[i] != "\n":
                i += 1
        elif c == "\\":
            if i + 1 < n and text[i + 1] == "\n":
                flush(i)  # a line continuation separates words
                line += 1
                i += 2
            else:
                begin()
                lit(text[i + 1] if i + 1 < n else "\\", False)
                i += 2
        elif c == "'":
            begin()
            j = text.find("'", i + 1)
            if j < 0:
                raise ShellSyntaxError(line, "unterminated single quote")
            lit(text[i + 1 : j], True)
            line += text.count("\n", i, j)
            if not parts[-1].text:
                parts[-1].text = ""
            i = j + 1
        elif c == '"':
            begin()
            i += 1
            parts.append(Part("lit", "", quoted=True))  # "" is an empty word, not nothing
            while True:
                if i >= n:
                    raise ShellSyntaxError(start_line, "unterminated double quote")
                c = text[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n:
                    nxt = text[i + 1]
                    if nxt == "\n":
                        line += 1
                    elif nxt in '$`"\\':
                        lit(nxt, True)
                    else:
                        lit("\\" + nxt, True)
                    i += 2
                elif c == "$":
                    dollar(True)
                elif c == "`":
                    j = text.find("`", i + 1)
                    if j < 0:
                        raise ShellSyntaxError(line, "unterminated backquote")
                    parts.append(Part("sub", text[i : j + 1], text[i : j + 1], True))
                    line += text.count("\n", i, j)
                    i = j + 1
                else:
                    if c == "\n":
                        line += 1
                    lit(c, True)
                    i += 1
        elif c == "$":
            begin()
            dollar(False)
        elif c == "`":
            begin()
            j = text.find("`", i + 1)
            if j < 0:
                raise ShellSyntaxError(line, "unterminated backquote")
            parts.append(Part("sub", text[i : j + 1], text[i : j + 1], False))
            line += text.count("\n", i, j)
            i = j + 1
        elif c == "<" and (m := PLACEHOLDER.match(text, i)):
            begin()  # a template placeholder such as <NNODES>, not a redirection
            lit(m.group(0), False)
            i = m.end()
        elif c in "<>" or (start < 0 and (m := REDIR.match(text, i))):
            flush(i)
            m = REDIR.match(text, i)
            assert m is not None
            out.append(Op(m.group(0), line, i, m.end()))
            i = m.end()
        elif c in "|&;":
            flush(i)
            op = next(o for o in OPS if text.startswith(o, i))
            out.append(Op(op, line, i, i + len(op)))
            i += len(op)
        elif c in "()" and start < 0:
            out.append(Op(c, line, i, i + 1))
            i += 1
        else:
            begin()
            lit(c, False)
            i += 1
    flush(n)
    return out


def commands(tokens: list[Word | Op], text: str = "") -> list[Command]:
    """Group tokens into simple commands; redirections (with their target) are set aside."""
    out: list[Command] = []
    words: list[Word] = []
    redirs: list[str] = []
    pending = ""
    span = [-1, -1]

    def close(end: str) -> None:
        nonlocal words, redirs
        if words:
            raw = text[span[0] : span[1]] if text else " ".join(w.raw for w in words)
            out.append(Command(words, words[0].line, raw, end, redirs, span[0], span[1]))
        words, redirs = [], []
        span[0] = span[1] = -1

    def grow(tok: Word | Op) -> None:
        if span[0] < 0:
            span[0] = tok.start
        span[1] = tok.end

    for tok in tokens:
        if isinstance(tok, Word):
            grow(tok)
            if pending:
                redirs.append(f"{pending} {tok.raw}")
                pending = ""
            else:
                words.append(tok)
        elif tok.text in OPS or tok.text == "\n" or tok.text in "()":
            close(tok.text)
        else:  # a redirection, with its target word unless it is >&N
            grow(tok)
            if re.search(r"&(\d+|-)$", tok.text):
                redirs.append(tok.text)
            else:
                pending = tok.text
    close("")
    return out


def split_script(text: str, first_line: int = 1) -> list[Command]:
    return commands(lex(text, first_line), text)


def statements(cmds: list[Command], text: str) -> list[list[Command]]:
    """Commands joined by |, && or || form one statement (a pipeline or and-or list)."""
    out: list[list[Command]] = []
    for c in cmds:
        if out and out[-1][-1].end in ("|", "&&", "||"):
            out[-1].append(c)
        else:
            out.append([c])
    return out


def source(stmt: list[Command], text: str) -> str:
    """The statement's text exactly as written (continuation lines included)."""
    return text[stmt[0].start : stmt[-1].stop]
