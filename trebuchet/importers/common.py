"""What every importer shares: notes with line numbers, secret detection, the YAML output.

A note is printed on stderr as `FILE:LINE: not carried over: WHAT (WHY)`; values that look
like secrets are masked in every note, and secret values never reach the spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trebuchet.spec.dump import dump_yaml

NOT_CARRIED = "not carried over"
NOTE = "note"

# Names whose values are credentials: HF_TOKEN, GH_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY...
SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|PAT|CREDENTIALS?)$|(?:^|_)(?:SECRET|PASSWORD)_",
    re.IGNORECASE,
)
# Values that look like credentials whatever the variable is called.
SECRET_VALUE = re.compile(
    r"\bhf_[A-Za-z0-9]{16,}|\bgh[pousr]_[A-Za-z0-9]{16,}|\bgithub_pat_\w{16,}"
    r"|\bsk-[A-Za-z0-9_-]{16,}|\bxox[abpr]-[A-Za-z0-9-]{10,}|\bAKIA[0-9A-Z]{16}\b"
    r"|\bglpat-[\w-]{16,}|\b[0-9a-f]{32,}\b"
)
PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9_ .:|-]*>")
SPEC_ORDER = (
    "name",
    "command",
    "workdir",
    "launcher",
    "nodes",
    "procs_per_node",
    "gpus_per_node",
    "master_port",
    "env",
    "secrets",
    "environment",
    "retries",
    "timeout",
    "timeout_warning",
    "checkpoint_signal",
    "profile",
    "slurm",
    "skypilot",
    "kubernetes",
)


def is_secret(name: str, value: str | None = None) -> bool:
    """A credential by its name (*_TOKEN, *_KEY, *_SECRET...) or by the look of its value."""
    return bool(SECRET_NAME.search(name)) or bool(value and SECRET_VALUE.search(value))


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

    def add_secret(self, name: str, value: str | None = None) -> None:
        secrets = self.spec.setdefault("secrets", [])
        if name not in secrets:
            secrets.append(name)
        if value and len(value) >= 4 and "$" not in value:
            self.secret_values[value] = name

    def redact(self, text: str) -> str:
        for value in sorted(self.secret_values, key=len, reverse=True):
            text = text.replace(value, "***")
        return SECRET_VALUE.sub("***", text)

    def messages(self) -> list[str]:
        """The notes as `FILE:LINE: kind: text`, in line order, secrets masked."""
        out: list[str] = []
        for n in sorted(self.notes, key=lambda n: n.line or 0):
            where = f"{self.source}:{n.line}" if n.line else self.source
            text = self.redact(f"{where}: {n.kind}: {n.text}")
            if text not in out:  # the same thing seen twice (two srun tasks) is said once
                out.append(text)
        return out

    def ordered(self) -> dict[str, Any]:
        spec = {k: self.spec[k] for k in SPEC_ORDER if self.spec.get(k) not in (None, {}, [])}
        rest = {k: v for k, v in self.spec.items() if k not in spec}
        spec.update({k: v for k, v in rest.items() if v not in (None, {}, [])})
        return spec

    def to_yaml(self) -> str:
        head = f"# imported by `treb import {self.kind}` from {self.source}\n"
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
