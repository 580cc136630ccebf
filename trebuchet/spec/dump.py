"""YAML as people write it (the importers, the Kubernetes render), and a command line as
one comment line (`--print-spec`'s head), whatever the words hold."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

import yaml


class BlockDumper(yaml.SafeDumper):
    pass


# YAML's line breaks besides \n: raw in a plain, single-quoted or literal scalar they fold
# into a space or a newline on load (a script's lone U+0085 became the command ' ')
_BREAKS = ("\r", "\x85", "\u2028", "\u2029")


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if any(c in value for c in _BREAKS):  # escaped in double quotes: \r, \N, \L, \P
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    if "\n" in value and not any(line != line.rstrip() for line in value.split("\n")):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


BlockDumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    """Block-style YAML, keys in the given order, multi-line strings as literal blocks."""
    return yaml.dump(data, Dumper=BlockDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=1000)  # fmt: skip


# bash's $'...' escapes of the characters it names
_NAMED = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\e",
          "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}  # fmt: skip


def shell_word(word: str) -> str:
    """`word` quoted for bash, in printable characters only: bash's $'...' with escapes
    where the word holds a character that is not printable (ESC, U+2028, U+202E, ...)."""
    if word.isprintable():
        return shlex.quote(word)
    out = []
    for c in word:
        code = ord(c)
        if c in _NAMED:
            out.append(_NAMED[c])
        elif c.isprintable():
            out.append(c)
        elif 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's escape of the byte code - 0xDC00
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80:  # \xHH is a byte: above 0x7f, a character is its \u form
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "$'" + "".join(out) + "'"


def comment_words(words: Iterable[str]) -> str:
    """A command line as one comment line: bash reads it back as the same words, and no
    reader (YAML, an editor, a terminal) sees a line break or a control character in it."""
    return " ".join(shell_word(w) for w in words)
