"""The dashboard's door: a random token (printed at start, as Jupyter does) on every
request, a CSRF token on every state-changing POST, and headers that keep pages inert.

The token arrives once in the URL and is swapped for a cookie and a redirect, so it does
not linger in the address bar or history. The cookie holds an HMAC of the token, never the
token: a browser sends 127.0.0.1's cookies to every port there. It is named after the port,
HttpOnly, SameSite=Strict; other cookies are ignored whatever they hold. Without it every
request (static files too) is refused with 403. The CSRF token is also an HMAC of the token,
a value a cross-site page can neither know nor read.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import parse_qsl, urlencode

# script-src 'self': no inline script runs (chart data travels as application/json);
# inline style attributes are allowed for the timeline's bar widths.
HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
     b"img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
     b"form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make POSTs Origin: null
    (b"cache-control", b"no-store"),
]  # fmt: skip

REFUSED = (
    b"403 Forbidden: this dashboard needs the token printed by `treb ui` "
    b"(open the URL it printed, with ?token=...)\n"
)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_token(token: str) -> str:
    return hmac.new(token.encode(), b"treb-ui csrf", hashlib.sha256).hexdigest()


def csrf_ok(token: str, given: str | None) -> bool:
    return bool(given) and same(csrf_token(token), str(given))


def cookie_value(token: str) -> str:
    """What the login cookie holds: derived from the token, which it does not reveal."""
    return hmac.new(token.encode(), b"treb-ui cookie", hashlib.sha256).hexdigest()


def same(expected: str, given: str) -> bool:
    """A constant-time comparison that takes any text (compare_digest refuses a str that is
    not ASCII: `?token=é` was a 500)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))


def cookies(header: bytes) -> list[tuple[str, str]]:
    """The (name, value) pairs of a Cookie header, read leniently one by one: a value that
    http.cookies cannot parse (JSON, say) in another app's cookie spoils nothing."""
    out = []
    for part in header.decode("latin-1").split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name:
            out.append((name.strip(), value.strip().strip('"')))
    return out


class TokenGate:
    """ASGI middleware: refuses (403) every HTTP request without the token."""

    def __init__(self, app, token: str, cookie: str) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie
        self.value = cookie_value(token)

    def _cookie_ok(self, headers: list[tuple[bytes, bytes]]) -> bool:
        return any(key == self.cookie and same(self.value, got) for name, value in headers
                   if name == b"cookie" for key, got in cookies(value))  # fmt: skip

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None and same(self.token, given):
            if scope["method"] == "GET":  # set the cookie, drop the token from the URL
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                where = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
                cookie = f"{self.cookie}={self.value}; Path=/; HttpOnly; SameSite=Strict"
                await _plain(send, 303, b"", [(b"location", where.encode()),
                                                (b"set-cookie", cookie.encode())])  # fmt: skip
                return
        elif not self._cookie_ok(scope.get("headers", [])):
            await _plain(send, 403, REFUSED, [])
            return

        async def with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


async def _plain(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()), *headers, *HEADERS]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
