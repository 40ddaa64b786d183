"""`HttpRetriever`: a `Retriever` backed by a retrieval server (ours, R1-Searcher's or Search-R1's).

One keep-alive connection pool, batches split to the server's limit, connection errors and 5xx
answers retried with capped exponential backoff within a budget (`RetryConfig`: by default about
a minute, so a server restart costs a pause, not the run), then `RetrievalUnavailable` with what
to do.

The transport is the standard library's `http.client`, not httpx: on a 64-query batch (a
~170 KB answer) httpx spent 1.2 ms of CPU per request against 0.4 ms here, which was a fifth of
the whole HTTP overhead next to an in-process BM25 search (bench/retrieval.py). The policy of
`searchrl.outbound` is kept by hand here: a total deadline per request (retries aside), answers
read up to `MAX_ANSWER_BYTES`, and a bearer token (`retrieval.api_key_env`) sent only to a loopback
host or to a host listed in $SEARCHRL_KEY_HOSTS. The URL is the user's own, not a
model's: no address policy.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import queue
import re
import time
from urllib.parse import SplitResult, urlsplit

from pydantic import Field
from pydantic_core import from_json, to_json

from searchrl.config import StrictModel
from searchrl.data.types import Passage
from searchrl.errors import RetrievalUnavailable, SearchRLError
from searchrl.outbound import KEY_HOSTS_ENV, MAX_ANSWER_BYTES, key_allowed, withheld
from searchrl.retrieval.base import Retriever

# api name -> (endpoint path, name of the `k` field in the request)
APIS = {
    "native": ("/search", "k"),
    "r1searcher": ("/queries", "k"),
    "search-r1": ("/retrieve", "topk"),
}
_R1_STRING = re.compile(r"^(?:(\d+)\s+)?Title:\s?(.*?) Text:\s?(.*)$", re.DOTALL)


class RetryConfig(StrictModel):
    """How long a request to a retrieval server is retried (refused connections, resets,
    timeouts, 5xx) before the run stops with `RetrievalUnavailable`. The wait before retry n is
    backoff_s * 2^(n-1), at most max_backoff_s; retrying ends after `retries` retries or once
    `total_s` seconds have passed since the first attempt, whichever comes first."""

    retries: int = Field(
        30, ge=0, description="Most retries of one request; with the default waits, total_s ends them first."
    )
    backoff_s: float = Field(0.5, ge=0, description="Wait before the first retry; doubled for each next one.")
    max_backoff_s: float = Field(
        5.0, ge=0, description="Longest wait between two attempts: a server back up is noticed within this."
    )
    total_s: float = Field(
        60.0, ge=0, description="Give up this many seconds after the first attempt. The default rides out a server "
        "restart (loading a large index can take longer: raise it then).",
    )

    def wait(self, retry: int, elapsed: float) -> float | None:
        """Seconds to sleep before retry number `retry` (1, 2, ...) when `elapsed` seconds have
        passed since the first attempt; None when the budget is spent."""
        if retry > self.retries or elapsed >= self.total_s:
            return None
        return min(self.backoff_s * 2 ** (retry - 1), self.max_backoff_s, self.total_s - elapsed)


class HttpRetriever(Retriever):
    """Search through a running retrieval server.

    `url` is the server root (`http://127.0.0.1:8000`) or a full endpoint URL whose path is one
    of `/search`, `/queries`, `/retrieve` (as Search-R1 configs write it). `timeout`: seconds one
    request may take in all; `api_key_env`: variable holding the server's bearer token.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retry: RetryConfig | None = None,
        max_batch: int = 512,
        api: str = "native",
        api_key_env: str | None = None,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        if api not in APIS:
            raise SearchRLError(f"unknown retrieval api {api!r}; choose one of: {', '.join(APIS)}")
        if max_batch < 1:
            raise SearchRLError(f"HttpRetriever needs max_batch >= 1 (got {max_batch})")
        path, self._k_field = APIS[api]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SearchRLError(
                f"retrieval url {url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000"
            )
        self.url = (
            url.rstrip("/") if parts.path.rstrip("/").endswith(path) else url.rstrip("/") + path
        )
        self.api = api
        self.retry = retry or RetryConfig()
        self.max_batch = max_batch
        self._key_env = api_key_env
        self._pool = _Connections(urlsplit(self.url), timeout, max_bytes, self._auth(api_key_env))
        self._health_path = urlsplit(self.url).path[: -len(path)] + "/health"

    def _auth(self, env: str | None) -> dict[str, str]:
        if env is None:
            return {}
        token = os.environ.get(env, "").strip()
        if not token:
            raise SearchRLError(
                f"retrieval.api_key_env names {env}, which is not set: export {env}=TOKEN "
                "(the token the server was started with, `searchrl serve --api-key-env`)"
            )
        if not key_allowed(self.url, user_server=True):
            withheld("the retrieval client", env, self.url, "only to a loopback host or one listed")
            return {}
        return {"Authorization": f"Bearer {token}"}

    def check(self) -> None:
        """One GET of the server's /health: any HTTP answer means a server listens (the
        R1-Searcher and Search-R1 servers have no /health and answer 404)."""
        try:
            self._pool.get(self._health_path)
        except (OSError, http.client.HTTPException) as exc:
            raise RetrievalUnavailable(
                f"no retrieval server answers at {self.url} ({type(exc).__name__}: {exc}). Start one with "
                f"`searchrl serve --index NAME_OR_DIR --port PORT` (and wait for its 'serving' line) or fix the URL."
            ) from None

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        out: list[list[Passage]] = [[] for _ in queries]
        # Blank queries never reach the server: their answer is [] by the Retriever promise.
        todo = [i for i, q in enumerate(queries) if q and q.strip()]
        for start in range(0, len(todo), self.max_batch):
            idx = todo[start : start + self.max_batch]
            for i, passages in zip(idx, self._request([queries[i] for i in idx], k), strict=True):
                out[i] = passages
        return out

    def _request(self, queries: list[str], k: int) -> list[list[Passage]]:
        body = {"queries": queries, self._k_field: k}
        if self.api == "search-r1":
            body["return_scores"] = True
        last, started, attempt = "", time.monotonic(), 0
        while True:
            if attempt:
                elapsed = time.monotonic() - started
                wait = self.retry.wait(attempt, elapsed)
                if wait is None:
                    raise self._unavailable(attempt, elapsed, last)
                time.sleep(wait)
            attempt += 1
            try:
                status, content = self._pool.post(to_json(body))
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, ...
                last = f"{type(exc).__name__}: {exc}"
                continue
            if status >= 500:
                last = f"HTTP {status}: {_detail(content)}"
                continue
            if status in (401, 403):
                raise SearchRLError(
                    f"retrieval server {self.url} refused the request (HTTP {status}: {_detail(content)}); "
                    + (f"check the token in {self._key_env} (retrieval.api_key_env)" if self._pool.auth else
                       f"set retrieval.api_key_env to the variable holding its token (over http to a host that is "
                       f"not loopback, add the host to {KEY_HOSTS_ENV})")
                )
            if status >= 400:
                raise SearchRLError(
                    f"retrieval server {self.url} rejected the request (HTTP {status}): {_detail(content)}"
                )
            try:
                data = from_json(content)
            except ValueError:
                raise SearchRLError(
                    f"retrieval server {self.url} answered HTTP {status} with non-JSON: {content[:200]!r}"
                ) from None
            results = self._parse(data)
            if len(results) != len(queries):
                raise SearchRLError(
                    f"retrieval server {self.url} answered {len(results)} result lists for {len(queries)} queries; "
                    f"is api={self.api!r} the right dialect for it?"
                )
            return results

    def _unavailable(self, attempts: int, elapsed: float, last: str) -> RetrievalUnavailable:
        if attempts > self.retry.retries:
            spent = f"retrieval.retry.retries (now {self.retry.retries})"
        else:
            spent = f"retrieval.retry.total_s (now {self.retry.total_s:g})"
        return RetrievalUnavailable(
            f"retrieval server {self.url} did not answer for {elapsed:.1f} s ({attempts} attempts; last: {last}). "
            f"Start it with `searchrl serve --index NAME_OR_DIR --port PORT` or fix the URL; "
            f"if it was restarting, raise {spent} to wait longer."
        )

    def _parse(self, data: dict) -> list[list[Passage]]:
        try:
            if self.api == "native":
                return [
                    [Passage(d["id"], d["title"], d["text"], d["score"]) for d in ps]
                    for ps in data["results"]
                ]
            if self.api == "r1searcher":
                n = len(data["answers"])
                ids = data.get("ids") or [None] * n
                scores = data.get("scores") or [None] * n
                return [
                    _r1_passages(a, i, s)
                    for a, i, s in zip(data["answers"], ids, scores, strict=True)
                ]
            return [[_search_r1_passage(d) for d in ps] for ps in data["result"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise SearchRLError(
                f"retrieval server {self.url} sent an answer that is not the {self.api!r} format ({exc!r}); "
                f"set api= to the server's dialect (native, r1searcher, search-r1)"
            ) from None

    def close(self) -> None:
        self._pool.close()


class _Connections:
    """Keep-alive HTTP/1.1 connections to one endpoint, shared safely between threads: each
    request takes an idle connection (or opens one) and puts it back when the answer is read."""

    # A pooled connection the server closed while idle (uvicorn drops them after 5 s) fails with
    # one of these on first use; the request is then resent at once on a fresh connection.
    _STALE = (
        http.client.RemoteDisconnected,
        BrokenPipeError,
        ConnectionResetError,
        ConnectionAbortedError,
    )

    def __init__(self, url: SplitResult, timeout: float, max_bytes: int, auth: dict[str, str]) -> None:
        self._cls = (
            http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        )
        self._host, self._port, self._timeout, self._max_bytes = url.hostname, url.port, timeout, max_bytes
        self.auth = auth
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._idle: queue.SimpleQueue = queue.SimpleQueue()

    def post(self, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, body) of one POST; OSError / HTTPException when the transport fails."""
        return self._send("POST", self._path, body, {"Content-Type": "application/json"})

    def get(self, path: str) -> tuple[int, bytes]:
        """(HTTP status, body) of one GET of another path on the same server."""
        return self._send("GET", path, None, {})

    def _send(self, method: str, path: str, body: bytes | None, headers: dict) -> tuple[int, bytes]:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                conn, reused = self._idle.get_nowait(), True
            except queue.Empty:
                conn, reused = self._cls(self._host, self._port, timeout=self._timeout), False
            try:
                self._time_left(conn, deadline)
                conn.request(method, path, body, {**headers, **self.auth})
                self._time_left(conn, deadline)  # headers are read under one socket timeout per read
                resp = conn.getresponse()
                content = self._read(conn, resp, deadline)
            except TimeoutError:
                conn.close()
                self._time_left(conn, deadline)  # the deadline's own message once it has passed
                raise
            except self._STALE:
                conn.close()
                if reused:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if resp.will_close:
                conn.close()
            else:
                self._idle.put(conn)
            return resp.status, content

    def _time_left(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        """Give the next socket operations of `conn` what is left of the deadline; TimeoutError (an
        OSError: retried) when nothing is."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out: no whole answer within {self._timeout:g} s (the client's total deadline)")
        conn.timeout = left
        if conn.sock is not None:
            conn.sock.settimeout(left)

    def _read(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, deadline: float) -> bytes:
        """The body, read by the deadline (one recv per step) and at most `max_bytes` of it."""
        too_big = SearchRLError(
            f"retrieval server {self._host}:{self._port} answered more than {self._max_bytes} bytes; "
            "send smaller batches (fewer queries or a smaller k)"
        )
        if resp.length is not None and resp.length > self._max_bytes:
            raise too_big
        body = bytearray()
        while True:
            self._time_left(conn, deadline)
            chunk = resp.read1(1 << 20)
            if not chunk:
                resp.read()  # read1 leaves a wholly read answer open; this closes it, so the connection is reused
                return bytes(body)
            body += chunk
            if len(body) > self._max_bytes:
                raise too_big

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def _detail(content: bytes) -> str:
    """The server's explanation: FastAPI's `detail` (a string, or a list of validation errors)."""
    try:
        detail = from_json(content).get("detail", content.decode(errors="replace"))
    except (ValueError, AttributeError):
        return content[:500].decode(errors="replace")
    if isinstance(detail, list):  # pydantic validation errors
        return "; ".join(
            f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', e)}" for e in detail
        )
    return str(detail)


def _stable_id(s: str) -> str:
    # R1-Searcher's own server sends bare strings; a content hash keeps retrieved-id logs stable.
    return "h" + hashlib.blake2b(s.encode(), digest_size=8).hexdigest()


def _r1_passages(answers: list[str], ids: list[str] | None, scores: list | None) -> list[Passage]:
    out = []
    for j, s in enumerate(answers):
        m = _R1_STRING.match(s)
        num, title, text = m.groups() if m else (None, "", s)
        pid = ids[j] if ids else (num or _stable_id(s))
        out.append(Passage(str(pid), title, text, scores[j] if scores else None))
    return out


def _search_r1_passage(item: dict) -> Passage:
    doc, score = (item["document"], item.get("score")) if "document" in item else (item, None)
    if "title" in doc and "text" in doc:  # some FlashRAG corpora keep both fields
        title, text = doc["title"], doc["text"]
    else:
        title, _, text = doc["contents"].partition("\n")
        if len(title) >= 2 and title[0] == title[-1] == '"':
            title = title[1:-1]
    return Passage(str(doc.get("id", _stable_id(doc.get("contents", "")))), title, text, score)
