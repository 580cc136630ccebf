"""The spec's `notify:` webhooks (docs/notify.md), signed with a key the spec names but
never holds. Sent by the job controller (runtime/publish/webhooks.py); validated here, so
that a bad one is refused before anything runs."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trebuchet.runtime.contracts.schema import NOTIFY_EVENTS as EVENTS
from trebuchet.runtime.publish.webhooks import SECRET_REF, url_problem
from trebuchet.spec.source import shortened

MAX_URL = 2048
MAX_HOOKS = 32
SECRET_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
ON_ALLOWED = "a list of " + ", ".join(EVENTS) + " or {log: <regular expression>}"


def allowed(text: str, description: str, **kw: Any) -> Any:
    """model.allowed's Field (model.py imports this module, so it cannot be imported)."""
    return Field(description=description, json_schema_extra={"x-allowed": text}, **kw)


class Webhook(BaseModel):
    """One webhook: its URL, the events it gets, the variable holding its HMAC key."""

    model_config = ConfigDict(extra="forbid", validate_default=True)  # as model.Block

    url: str = allowed(
        "an http:// or https:// URL, or ${NAME} for a URL kept in the secret NAME",
        "where the JSON is POSTed (a Slack hook gets Slack's {text} body)",
        max_length=MAX_URL,
    )  # fmt: skip
    on: list[Any] = allowed(
        ON_ALLOWED, "the events sent: the run's start and end, a hang, a log line's pattern",
        min_length=1, max_length=64,
    )  # fmt: skip
    secret: str | None = allowed(
        "the NAME of an environment variable holding the HMAC key (never the key itself)",
        "signs each body: X-Treb-Signature: sha256=<HMAC-SHA256 of the body>",
        default=None,
    )  # fmt: skip

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if SECRET_REF.fullmatch(v):
            return v
        why = url_problem(v)
        if why == "the port is not between 1 and 65535":
            raise ValueError(why)
        if why:
            raise ValueError("bad url")
        return v

    @field_validator("on")
    @classmethod
    def _on(cls, v: list[Any]) -> list[Any]:
        from trebuchet.runtime.watch.log_policies import unsafe_pattern

        out: list[Any] = []
        for item in v:
            if isinstance(item, str) and item in EVENTS:
                out.append(item)
            elif isinstance(item, dict) and list(item) == ["log"] and isinstance(item["log"], str):
                why = unsafe_pattern(item["log"]) if item["log"] else "an empty pattern"
                if why:
                    raise ValueError(f"log pattern {shortened(repr(item['log']))}: {why}")
                out.append({"log": item["log"]})
            else:
                raise ValueError(f"{shortened(repr(item))} is not one of them")
        return out

    @field_validator("secret")
    @classmethod
    def _secret(cls, v: str | None) -> str | None:
        if v is None:
            return v
        looks_like_key = (
            not SECRET_NAME.fullmatch(v)
            or (len(v) >= 20 and "_" not in v)
            or sum(c.isdigit() for c in v) >= 6
        )
        if looks_like_key:
            raise ValueError(
                "this looks like a key, not a variable's name: write the NAME of an "
                "environment variable that holds it (e.g. TREB_WEBHOOK_KEY); a key in the "
                "spec would be written to disk"
            )
        return v
