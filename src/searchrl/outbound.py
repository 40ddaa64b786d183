"""Every outbound HTTP request of searchrl is made here, under one policy.

- A total deadline per request: wall clock for the whole request, redirects and body included
  (httpx's own timeouts are per read: a server sending a byte a second would hold a request for
  hours). Every socket operation gets the time left, and none starts once it is spent.
- A size cap: bodies are read streamed and cut at the cap; compressed bodies are refused (we ask
  for none), since their size on the wire says nothing of their size in memory.
- An address policy for URLs that came from a search result or a model (`check_public_url`,
  `client(public_only=True)`): http and https only, and every address a host resolves to must be
  public. It is enforced when connecting, on the addresses just checked, for every hop of a
  redirect, so a name that re-resolves (DNS rebinding) cannot slip past; TLS still verifies the
  URL's host name.
- A key policy (`key_allowed`): an API key goes only over https to its provider's own host, or to
  a host the user lists in $SEARCHRL_KEY_HOSTS — never because a config file names a URL.

Clients made here ignore the proxy environment variables (HTTP_PROXY, ...): a proxy would make
the connect-time check see the proxy, not the page.
"""

from __future__ import annotations

import contextvars
import ipaddress
import os
import socket
import time
import warnings
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

import httpcore
import httpx

from searchrl.errors import DataWarning, SearchRLError

KEY_HOSTS_ENV = "SEARCHRL_KEY_HOSTS"
# Largest answer of an API (search results, a chat completion, a retrieval batch) read.
MAX_ANSWER_BYTES = 64 * 2**20
SCHEMES = ("http", "https")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT; not in is_private
# (monotonic time the request must end by, its length in seconds) of the request this thread sends.
_DEADLINE: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("deadline", default=None)
_DEADLINE_KEY = "searchrl.deadline"


class OutboundRefused(SearchRLError):
    """A request the policy refuses: a scheme or address it may not reach, an answer over its cap."""


class KeyWithheld(DataWarning):
    """An API key was not sent: the URL is not https to the provider's host nor a listed host."""


# ------------------------------------------------------------------------------ address policy


def blocked_reason(ip: str) -> str | None:
    """Why an address may not be fetched for a model or a search result; None when it is public.

    >>> [blocked_reason(a) for a in ("93.184.216.34", "127.0.0.1", "10.1.2.3", "169.254.169.254", "::ffff:192.168.0.1")]
    [None, 'loopback', 'private', 'link-local', 'private']
    >>> [blocked_reason(a) for a in ("100.64.0.1", "224.0.0.1", "0.0.0.0", "fd00::1", "2606:4700::1")]
    ['shared (CGNAT)', 'multicast', 'unspecified', 'private', None]
    """
    addr = ipaddress.ip_address(ip.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is not part of it
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    for name, hit in (("loopback", addr.is_loopback), ("unspecified", addr.is_unspecified),
                      ("link-local", addr.is_link_local), ("multicast", addr.is_multicast),
                      ("shared (CGNAT)", addr in _SHARED), ("private", addr.is_private),
                      ("reserved", addr.is_reserved or not addr.is_global)):
        if hit:
            return name
    return None


def split_url(url: str):
    """`urlsplit(url)`, or `OutboundRefused` for a URL it rejects (`http://[::1:P/x`, a netloc that
    changes under NFKC normalization) or that is not a string: a search result or a model wrote it."""
    if not isinstance(url, str):
        raise OutboundRefused(f"{type(url).__name__} is not a URL: not fetched")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise OutboundRefused(f"{url[:300]}: not a valid URL ({exc}): not fetched") from None
    try:
        parts.port  # noqa: B018 - a port out of range or not a number raises here
    except ValueError as exc:
        raise OutboundRefused(f"{url[:300]}: not a valid port ({exc}): not fetched") from None
    return parts


def _check_scheme(url: str) -> None:
    scheme = split_url(url).scheme.lower()
    if scheme not in SCHEMES:
        raise OutboundRefused(f"{url}: only http and https URLs are fetched, not {scheme or 'a relative URL'}:")


def public_addresses(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, all of them public; `OutboundRefused` names the first that is not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise OutboundRefused(f"cannot resolve {host} ({exc}): not fetched") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    for ip in addresses:
        if reason := blocked_reason(ip):
            what = f"{host} is" if ip == host.strip("[]") else f"{host} resolves to {ip},"
            article = "an" if reason[0] in "aeiou" else "a"
            raise OutboundRefused(
                f"{what} {article} {reason} address: not fetched for a search result or a model. "
                "To read intranet pages, set retrieval.web.allow_private=true (--web-allow-private)"
            )
    return addresses


def check_public_url(url: str, allow_private: bool = False) -> None:
    """Refuse (`OutboundRefused`) a URL a search result or a model gave that is not http(s), or
    whose host resolves to a non-public address unless `allow_private`. A quick check for a clear
    message; `client(public_only=True)` enforces the same at connect time on every hop."""
    _check_scheme(url)
    parts = split_url(url)
    if not parts.hostname:
        raise OutboundRefused(f"{url}: no host to fetch from")
    if not allow_private:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        public_addresses(parts.hostname, port)


# ------------------------------------------------------------------------------ key policy


def key_hosts() -> set[str]:
    """The hosts the user allows keys to go to ($SEARCHRL_KEY_HOSTS, comma-separated)."""
    return {h.strip().lower() for h in os.environ.get(KEY_HOSTS_ENV, "").split(",") if h.strip()}


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name, an address, `[::1]`) is this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def key_allowed(url: str, own_hosts: Iterable[str] = (), *, user_server: bool = False) -> bool:
    """May a key be sent to `url`? Yes over https to one of `own_hosts` (the provider's), or to a
    host in $SEARCHRL_KEY_HOSTS (http too). `user_server`: a server the user runs (retrieval),
    which has no host of its own: also a loopback host. Any other host must be listed, so that
    a shared config naming a URL cannot send a key there.

    >>> key_allowed("https://api.openai.com/v1", {"api.openai.com"}), key_allowed("http://api.openai.com/v1", {"api.openai.com"})
    (True, False)
    >>> key_allowed("https://evil.example/v1", {"api.openai.com"}), key_allowed("http://127.0.0.1:8000", user_server=True)
    (False, True)
    >>> key_allowed("https://retrieval.example", user_server=True)
    False
    """
    try:
        parts = split_url(url)
    except OutboundRefused:
        return False
    host = (parts.hostname or "").lower()
    if host in key_hosts():
        return True
    if user_server and is_loopback_host(host):
        return True
    return parts.scheme == "https" and host in {h.lower() for h in own_hosts}


def withheld(role: str, env: str, url: str, rule: str) -> None:
    """Say (once per message) that the key in `env` was not sent to `url`, and how to allow it."""
    try:
        host = split_url(url).hostname or url
    except OutboundRefused:
        host = url
    warnings.warn(KeyWithheld(
        f"{role}: the key in {env} is not sent to {url} (keys go {rule}); the requests go without it. "
        f"To send it, add {host} to {KEY_HOSTS_ENV} (comma-separated host names)"
    ), stacklevel=3)


# ------------------------------------------------------------------------------ the transport


def _time_left(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout` cut to what is left of this request's total deadline; `error` once none is left."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline[0] - time.monotonic()
    if left <= 0:
        raise error(f"the request passed its total deadline of {deadline[1]:g} s")
    return left if timeout is None else min(timeout, left)


def _within(operation, timeout: float | None, error: type[Exception]):
    """`operation(seconds)` by the deadline; a timeout that is the deadline's says so."""
    try:
        return operation(_time_left(timeout, error))
    except httpcore.TimeoutException:
        _time_left(None, error)  # raises the deadline's message when it has passed
        raise


class _Stream(httpcore.NetworkStream):
    """A socket whose every read and write ends by the request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return _within(lambda t: self.inner.read(max_bytes, t), timeout, httpcore.ReadTimeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _within(lambda t: self.inner.write(buffer, t), timeout, httpcore.WriteTimeout)

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None) -> _Stream:
        return _Stream(self.inner.start_tls(ssl_context, server_hostname, _time_left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """Connects within the deadline; `public_only`: to the checked public addresses of the host."""

    def __init__(self, public_only: bool) -> None:
        self.inner, self.public_only = httpcore.SyncBackend(), public_only

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        timeout = _time_left(timeout, httpcore.ConnectTimeout)
        if not self.public_only:
            return _Stream(self.inner.connect_tcp(host, port, timeout, local_address, socket_options))
        failed: Exception | None = None
        for ip in public_addresses(host, port):  # connect to what was checked, never re-resolve
            try:
                return _Stream(self.inner.connect_tcp(ip, port, _time_left(timeout, httpcore.ConnectTimeout),
                                                      local_address, socket_options))
            except httpcore.ConnectError as exc:
                failed = exc
        raise failed or httpcore.ConnectError(f"{host} has no address")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    """A response body read within the deadline and cut at `max_bytes`: the bytes up to the cap
    are given, then `OutboundRefused` if more come (a reader that stops at the cap never sees it)."""

    def __init__(self, inner: httpx.SyncByteStream, deadline: tuple[float, float] | None, max_bytes: int, url) -> None:
        self.inner, self.deadline, self.max_bytes, self.url = inner, deadline, max_bytes, url

    def __iter__(self) -> Iterator[bytes]:
        chunks, size = iter(self.inner), 0
        while True:
            token = _DEADLINE.set(self.deadline)
            try:
                chunk = next(chunks, None)
            finally:
                _DEADLINE.reset(token)
            if chunk is None:
                return
            if size + len(chunk) > self.max_bytes:
                if size < self.max_bytes:
                    yield chunk[: self.max_bytes - size]
                raise OutboundRefused(f"{self.url} answered more than {self.max_bytes} bytes, the most read")
            size += len(chunk)
            yield chunk

    def close(self) -> None:
        self.inner.close()


class _Transport(httpx.HTTPTransport):
    def __init__(self, public_only: bool, max_bytes: int) -> None:
        # HTTPTransport's __init__ only builds its pool, and takes no network backend: ours is
        # built here instead, as it would build it (httpx's default limits).
        self.max_bytes = max_bytes
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=100, max_keepalive_connections=20,
            keepalive_expiry=5.0, network_backend=_Backend(public_only),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        _check_scheme(str(request.url))  # every hop: httpx calls this once per redirect (and refuses other schemes there too)
        deadline = request.extensions.get(_DEADLINE_KEY)
        token = _DEADLINE.set(deadline)
        try:
            response = super().handle_request(request)
        finally:
            _DEADLINE.reset(token)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            response.close()
            raise OutboundRefused(f"{request.url} sent a {encoding}-compressed answer though none was asked for")
        response.stream = _Body(response.stream, deadline, self.max_bytes, request.url)
        return response


class Client(httpx.Client):
    """An httpx client under the policy; see `client`."""

    def __init__(self, deadline_s: float, max_bytes: int, public_only: bool, **kwargs) -> None:
        super().__init__(transport=_Transport(public_only, max_bytes), timeout=deadline_s, **kwargs)
        self.deadline_s = deadline_s

    def build_request(self, method: str, url, **kwargs) -> httpx.Request:
        _check_scheme(str(url))  # before httpx reads `file:/x` as the relative URL `/x`
        return super().build_request(method, url, **kwargs)

    def send(self, request: httpx.Request, **kwargs) -> httpx.Response:
        if _DEADLINE_KEY not in request.extensions:  # redirects keep the first hop's extensions, hence its deadline
            request.extensions = {**request.extensions, _DEADLINE_KEY: (time.monotonic() + self.deadline_s, self.deadline_s)}
        return super().send(request, **kwargs)


def client(deadline_s: float, max_bytes: int = MAX_ANSWER_BYTES, *, public_only: bool = False,
           follow_redirects: bool = False, headers: dict[str, str] | None = None) -> Client:
    """The HTTP client of every outbound caller: each request ends within `deadline_s` seconds
    (redirects and body included), reads at most `max_bytes` of an answer; `public_only`: for URLs
    from a search result or a model (the address policy). API clients keep `follow_redirects`
    off: a redirect would carry a key header to wherever it points."""
    return Client(deadline_s, max_bytes, public_only, follow_redirects=follow_redirects,
                  headers={"Accept-Encoding": "identity", **(headers or {})})
