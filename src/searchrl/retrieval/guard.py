"""What the retrieval server checks before a request reaches a route (an ASGI middleware).

In order, each answered at once with a JSON `detail`, before any body byte is read:
- Host (only when bound to loopback): `127.0.0.1`, `localhost` or `[::1]`, any port, else 400. A
  web page on this machine that rebinds its own DNS name to 127.0.0.1 sends its name as Host.
- Bearer token (when the server has one): `Authorization: Bearer <token>` on every route, compared
  in constant time, else 401 with `WWW-Authenticate: Bearer`.
- Without a token, `DELETE /cache` only from a loopback client, else 403.
- Body size: a Content-Length over the limit is 413; a body without one (chunked) is counted as it
  is read and refused with 413 at the first byte over the limit, so no request holds more.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from pydantic_core import to_json
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from searchrl.outbound import is_loopback_host

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
_HOST = re.compile(r"(\[[0-9a-fA-F:.]+\]|[^:\[\]]*)(?::\d{1,5})?")


def host_allowed(header: str) -> bool:
    """Whether a Host header names the loopback interface (`127.0.0.1`, `localhost`, `[::1]`,
    each with or without a port)."""
    m = _HOST.fullmatch(header)
    return m is not None and m.group(1).lower() in LOOPBACK_NAMES


class Guard:
    """Wraps the app: Host check (`loopback_only`), bearer `token`, `max_body` bytes."""

    def __init__(
        self, app: ASGIApp, *, max_body: int, token: str | None, loopback_only: bool
    ) -> None:
        self.app, self.max_body, self.loopback_only = app, max_body, loopback_only
        self.token = None if token is None else _digest(token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])  # a repeated header counts once: its last value
        if self.loopback_only and not host_allowed(headers.get(b"host", b"").decode("latin-1")):
            return await _refuse(
                send,
                400,
                "this server is bound to loopback and answers only Host: 127.0.0.1, "
                "localhost or [::1]; serve on another --host to be reached by another name",
            )
        if self.token is not None and not self._authorised(headers.get(b"authorization", b"")):
            return await _refuse(
                send,
                401,
                "this server needs `Authorization: Bearer <token>` with the token its "
                "--api-key-env variable holds",
                {"www-authenticate": "Bearer"},
            )
        if (
            self.token is None
            and scope["method"] == "DELETE"
            and scope["path"] == "/cache"
            and not is_loopback_host((scope.get("client") or ("",))[0])
        ):
            return await _refuse(
                send,
                403,
                "DELETE /cache is accepted only from this machine unless the server has "
                "a token (`searchrl serve --api-key-env NAME`)",
            )
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body:
            return await _refuse(send, 413, self._too_large(f"{int(length):,} bytes"))
        await self.app(scope, self._capped(receive), send)

    def _authorised(self, header: bytes) -> bool:
        scheme, _, given = header.partition(b" ")
        # Digests compared, whatever the scheme: the time taken says nothing of the token, its
        # length included.
        same = hmac.compare_digest(_digest(given.strip()), self.token)
        return same and scheme.lower() == b"bearer"

    def _capped(self, receive: Receive) -> Receive:
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                # Raised inside the app's body read; Starlette answers it as a 413 response.
                raise HTTPException(413, self._too_large(f"more than {self.max_body:,} bytes"))
            return message

        return capped

    def _too_large(self, size: str) -> str:
        return (
            f"request body of {size} exceeds the server limit of {self.max_body:,} bytes; send "
            f"smaller batches or restart the server with a larger `searchrl serve --max-body-mb`"
        )


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


async def _refuse(
    send: Send, status: int, detail: str, extra: dict[str, str] | None = None
) -> None:
    body = to_json({"detail": detail})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
