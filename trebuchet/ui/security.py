"""The dashboard's door: a random token (printed at start, as Jupyter does) on every
request, a CSRF token on every state-changing POST, and headers that keep pages inert.

The token arrives once in the URL (`/?token=...`); the answer sets it as an HttpOnly,
SameSite=Strict cookie and redirects to the same URL without it, so it does not linger in
the address bar or the history. Every later request must carry the cookie; anything else
is refused with 403, static files included. The CSRF token is derived from the token
(HMAC), so forms carry a value a cross-site page cannot know or read.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie
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
    return bool(given) and hmac.compare_digest(csrf_token(token), str(given))


class TokenGate:
    """ASGI middleware: refuses (403) every HTTP request without the token."""

    def __init__(self, app, token: str, cookie: str) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie

    def _cookie_ok(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"cookie":
                jar = SimpleCookie()
                try:
                    jar.load(value.decode("latin-1"))
                except Exception:  # noqa: BLE001 - a malformed cookie is no token
                    continue
                got = jar.get(self.cookie)
                if got is not None and hmac.compare_digest(got.value, self.token):
                    return True
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None and hmac.compare_digest(given, self.token):
            if scope["method"] == "GET":  # set the cookie, drop the token from the URL
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                where = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
                cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
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
