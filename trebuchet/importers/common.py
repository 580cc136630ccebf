"""What every importer shares: notes with line numbers, secret detection, the YAML output.

A note is printed on stderr as `FILE:LINE: not carried over: WHAT (WHY)`; values that look
like secrets are masked in every note, and secret values never reach the spec.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.runtime.rundir.regular import NotRegular, open_regular
from trebuchet.runtime.watch.display_lines import inert
from trebuchet.spec.dump import dump_yaml

NOT_CARRIED = "not carried over"
NOTE = "note"

# Names whose values are credentials: HF_TOKEN, GH_TOKEN, WANDB_API_KEY, DB_PASS,
# API_TOKEN_V2, AWS_SECRET_ACCESS_KEY... (a part of the name, between underscores or digits).
SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|PASSPHRASE|PAT|CREDENTIALS?|APIKEY"
    r"|PRIVATE_?KEY)(?=$|_|\d)|_PWD?(?=$|_|\d)",
    re.IGNORECASE,
)
# Values that look like credentials whatever the variable is called: (pattern, what it is).
CREDENTIALS = [
    (re.compile(p), kind)
    for p, kind in (
        (r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----", "a private key"),
        (r"LS0tLS1CRUdJTi[A-Za-z0-9+/=]*", "a base64-encoded key"),
        (r"\bhf_[A-Za-z0-9]{16,}", "a Hugging Face token"),
        (r"\bgh[pousr]_[A-Za-z0-9]{16,}|\bgithub_pat_\w{16,}", "a GitHub token"),
        (r"\bsk-[A-Za-z0-9_-]{16,}", "an API key (sk-)"),
        (r"\bxox[abprs]-[A-Za-z0-9-]{10,}", "a Slack token"),
        (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", "an AWS access key"),
        (r"\bglpat-[\w-]{16,}", "a GitLab token"),
        (r"\beyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]*", "a JWT"),
        (r"\b[0-9a-fA-F]{32,}\b", "a hex key"),
        (r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:[^\s/@]+@", "a password in a URL"),
    )
]
# A word of a base64 / URL-safe alphabet ("=" only as padding: NAME=value is two words).
_RUN = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")


def _class(c: str) -> int:
    return 1 if c.isupper() else 2 if c.islower() else 3 if c.isdigit() else 0


def _high_entropy(run: str) -> bool:
    """Random-looking: letters and digits of a random key switch between upper, lower and
    digit at ~64% of their neighbours (names, paths and model ids at under 35%)."""
    alnum = [_class(c) for c in run if c.isascii() and c.isalnum()]
    if len(alnum) < 20 or len(set(alnum)) < 2:
        return False
    changes = sum(a != b for a, b in zip(alnum, alnum[1:], strict=False))
    chars = [c for c in run if c.isascii() and c.isalnum()]
    return changes >= 0.4 * (len(alnum) - 1) and len(set(chars)) >= 0.4 * len(chars)


def credential_spans(text: str) -> list[tuple[int, int, str]]:
    """Where `text` holds something that looks like a credential: (start, end, what)."""
    spans = [(m.start(), m.end(), kind) for rx, kind in CREDENTIALS for m in rx.finditer(text)]
    spans += [(m.start(), m.end(), "high entropy") for m in _RUN.finditer(text)
              if _high_entropy(m.group())]  # fmt: skip
    return _merged(spans)


def _merged(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]), out[-1][2])
        else:
            out.append((start, end, kind))
    return out


def credential_kind(text: str | None) -> str | None:
    """What in `text` looks like a credential ("a GitHub token", "high entropy"), or None."""
    spans = credential_spans(text) if text else []
    return spans[0][2] if spans else None


def mask(text: str, spans: list[tuple[int, int, str]], by: str = "***") -> str:
    """`text` with each span replaced."""
    out, at = [], 0
    for start, end, _ in spans:
        out += [text[at:start], by]
        at = end
    return "".join(out) + text[at:]


class Fragments:
    """Pieces of secret markers in a value: a marker is a random string of lowercase letters
    and digits, so any 6 characters of one (in any case) in a value mean the value was made
    from the secret (sliced, upper-cased, joined) wherever the script did it."""

    K = 6

    def __init__(self, markers: dict[str, str]) -> None:
        self.grams: dict[str, str] = {}
        for marker, name in markers.items():
            low = marker.lower()
            for i in range(len(low) - self.K + 1):
                self.grams[low[i : i + self.K]] = name

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, the secret's name) of each run of marker pieces in `text`."""
        if not self.grams:
            return []
        low, k, out = text.lower(), self.K, []
        for m in re.finditer(f"[a-z0-9]{{{k},}}", low):
            for i in range(m.start(), m.end() - k + 1):
                name = self.grams.get(low[i : i + k])
                if name:
                    out.append((i, i + k, name))
        return _merged(out)


PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9_ .:|-]*>")
SPEC_ORDER = (
    "name", "command", "workdir", "launcher", "nodes", "procs_per_node", "gpus_per_node",
    "master_port", "env", "secrets", "environment", "retries", "timeout", "timeout_warning",
    "checkpoint_signal", "profile", "slurm", "skypilot", "kubernetes",
)  # fmt: skip


def read_text(p: Path, what: str, max_bytes: int = 1 << 20) -> str:
    """A file's text; a named error for what cannot be `what` (a device, a FIFO, a binary,
    text that is not UTF-8, a huge file), read without ever holding more than max_bytes."""
    try:  # opened without a wait and checked on the descriptor: a FIFO never blocks
        with open_regular(p) as f:
            data = f.read(max_bytes + 1)
    except NotRegular:
        raise UserError(f"{p}: not a regular file") from None
    except OSError as exc:
        raise UserError(f"{p}: cannot read: {exc}") from None
    if len(data) > max_bytes:
        raise UserError(f"{p}: larger than {max_bytes // 1024} KiB: not {what}")
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise UserError(f"{p}:{line}: a NUL byte: a binary file, not {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(f"{p}:{line}: not UTF-8 text: not {what}") from None


def bash_syntax(text: str) -> str | None:
    """What bash -n says of `text` (its first problem is named by line); None when bash
    reads it whole."""
    import subprocess  # here: only `treb import sbatch` runs bash

    done = subprocess.run(["bash", "--noprofile", "--norc", "-n"], input=text,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    return done.stderr.strip() if done.returncode else None


def as_text(text: str) -> str:
    """One line a terminal shows as text: control characters (ESC, BEL, CR, LF...) as
    `^[`-style carets (runtime/lines.inert, as `treb logs` shows them), and what is not
    UTF-8 (a lone surrogate) escaped."""
    data = inert(text.encode("utf-8", "backslashreplace"))
    return data.replace(b"\r", b"^M").replace(b"\n", b"^J").decode("utf-8", "replace")


def is_secret(name: str, value: str | None = None) -> bool:
    """A credential by its name (*_TOKEN, *_KEY, *_PASS...) or by the look of its value."""
    return bool(SECRET_NAME.search(name)) or bool(credential_kind(value))


def to_name(text: str) -> str:
    """A valid run name ([a-z0-9][a-z0-9._-]*, 63 characters at most) from any text."""
    name = re.sub(r"[^a-z0-9._-]+", "-", str(text).lower())
    name = re.sub(r"-{2,}", "-", name).strip("-._")
    return (name or "job")[:63].rstrip("-._") or "job"


@dataclass
class Note:
    line: int | None
    text: str
    kind: str = NOT_CARRIED


@dataclass
class ImportResult:
    """The imported spec (plain data, loadable by load_spec) and what could not be carried."""

    kind: str
    source: str
    spec: dict[str, Any] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
    secret_values: dict[str, str] = field(default_factory=dict)  # value -> secret name

    def drop(self, line: int | None, what: str, why: str = "") -> None:
        """Record something of the input that the spec does not carry."""
        self.notes.append(Note(line, f"{what} ({why})" if why else what))

    def note(self, line: int | None, text: str) -> None:
        """Record how something was carried when it is not a one-to-one mapping."""
        self.notes.append(Note(line, text, NOTE))

    def drop_unknown(self, block: dict, known: Collection[str], at: Any, *path: Any) -> None:
        """Each key of `block` (at `path`) that is not `known`: named as not carried."""
        for k in block:
            if k not in known:
                self.drop(at(*path, k), ".".join(map(str, (*path, k))), "no spec field for it")

    def add_secret(self, name: str, value: str | None = None) -> None:
        secrets = self.spec.setdefault("secrets", [])
        if name not in secrets:
            secrets.append(name)
        if value and len(value) >= 4 and "$" not in value:
            self.secret_values[value] = name

    def redact(self, text: str) -> str:
        """`text` without a secret's value or anything that looks like a credential."""
        for value in sorted(self.secret_values, key=len, reverse=True):
            text = text.replace(value, "***")
        return mask(text, credential_spans(text))

    def messages(self) -> list[str]:
        """The notes as `FILE:LINE: kind: text`, in line order, secrets masked."""
        out: list[str] = []
        said: set[str] = set()  # (a list's `in` made 450,000 lines after `exit` quadratic)
        for n in sorted(self.notes, key=lambda n: n.line or 0):
            where = f"{self.source}:{n.line}" if n.line else self.source
            text = as_text(self.redact(f"{where}: {n.kind}: {n.text}"))
            if text not in said:  # the same thing seen twice (two srun tasks) is said once
                said.add(text)
                out.append(text)
        return out

    def ordered(self) -> dict[str, Any]:
        spec = {k: self.spec[k] for k in SPEC_ORDER if self.spec.get(k) not in (None, {}, [])}
        rest = {k: v for k, v in self.spec.items() if k not in spec}
        spec.update({k: v for k, v in rest.items() if v not in (None, {}, [])})
        return spec

    def to_yaml(self) -> str:
        # The file's name is the user's: a line break in it (\n, \r, U+0085, U+2028) would
        # end the comment and start a key (`retries: 7`); shown escaped, it stays a comment.
        source = "".join(c if c.isprintable() else repr(c)[1:-1] for c in self.source)
        head = f"# imported by `treb import {self.kind}` from {source}\n"
        return head + dump_yaml(self.ordered())


def env_or_secret(res: ImportResult, name: str, value: Any, line: int | None) -> None:
    """An environment entry: credentials become secrets by name, the rest goes to env."""
    text = "" if value is None else value if isinstance(value, str) else str(value)
    if isinstance(value, bool):
        text = "true" if value else "false"
    if is_secret(name, text):
        ref = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", text.strip())
        if ref and ref.group(1) != name:
            # NAME: ${OTHER}: OTHER is the secret; NAME gets it at launch.
            res.add_secret(ref.group(1))
            res.spec.setdefault("env", {})[name] = "${" + ref.group(1) + "}"
        else:
            res.add_secret(name, None if ref else text)
        return
    res.spec.setdefault("env", {})[name] = text
    if PLACEHOLDER.search(text):
        res.note(line, f"env.{name}: placeholder kept as is: {text}")
