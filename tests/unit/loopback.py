"""Loopback HTTP servers that stand in for paid services in tests: an OpenAI-compatible chat model
(the ACC_L judge, the page condenser) and the five web search APIs with the pages their results
link to; a server of named routes (redirects), and one that dribbles its answer. Each records
every request it gets."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Seen:
    """One request as the server got it; header names lowercased."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    at: float  # time.monotonic() on arrival


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 in a daemon thread; subclasses say what to `answer`."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def _handle(self, method: str) -> None:
                parts = urlsplit(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                seen = Seen(method, parts.path, dict(parse_qsl(parts.query)),
                            {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                with server.lock:
                    server.requests.append(seen)
                status, content, kind, *extra = server.answer(seen)
                if not isinstance(content, (str, bytes)):
                    content, kind = json.dumps(content), "application/json"
                data = content.encode() if isinstance(content, str) else content
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def answer(self, seen: Seen) -> tuple:
        """(status, body: str, bytes or a JSON-able value, content type[, extra headers])."""
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Routes(LoopbackServer):
    """Answers each path from `routes` (path -> answer tuple as `LoopbackServer.answer`), 404 otherwise."""

    def __init__(self, routes: dict[str, tuple]) -> None:
        super().__init__()
        self.routes = routes

    def answer(self, seen: Seen) -> tuple:
        return self.routes.get(seen.path, (404, "not found", "text/plain"))

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]


class DripServer:
    """A raw loopback server that answers every connection with `head` (bytes), then dribbles
    `body` one byte every `interval_s` seconds: a per-read timeout never fires."""

    def __init__(self, head: bytes, body: bytes, interval_s: float = 0.2) -> None:
        self.head, self.body, self.interval_s = head, body, interval_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(self.head)
                for i in range(len(self.body)):
                    if self.closed.wait(self.interval_s):
                        return
                    conn.sendall(self.body[i : i + 1])
            except OSError:  # the client hung up: what the tests want
                return

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


class FakeOpenAI(LoopbackServer):
    """A chat-completions server whose 'model' says True when a gold answer occurs in the prediction.

    `fail_first` requests get HTTP 503 (to exercise retries); `status` forces every reply's code;
    `reply` is the text of every answer (a verdict, a condensed page); `raw` the whole body.
    """

    def __init__(self) -> None:
        super().__init__()
        self.url = f"{self.base}/v1"
        self.fail_first = 0
        self.status = 200
        self.reply: str | None = None
        self.raw: str | None = None

    def answer(self, seen: Seen) -> tuple[int, Any, str]:
        if len(self.requests) <= self.fail_first:
            return 503, {"error": "overloaded"}, ""
        if self.status != 200:
            return self.status, {"error": "nope"}, ""
        if self.raw is not None:
            return 200, self.raw, "application/json"
        text = self.reply
        if text is None:
            user = seen.body["messages"][-1]["content"]
            golds = re.search(r"Gold answer\(s\): (.*)", user).group(1).split(" | ")
            pred = re.search(r"Predicted answer: (.*)", user).group(1)
            text = str(any(g.lower() in pred.lower() for g in golds))
        return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}, ""


FILLER = " ".join(["The town hosts a weekly market with stalls of wool, cheese and pottery."] * 10)
# path -> (title, snippet, page body or None for a page that is not there)
PAGES = {
    "/wiki/Quellbridge": ("Quellbridge - Wikipedia", "Quellbridge is a <strong>market town</strong>.", (
        "<html><head><title>Quellbridge - Wikipedia</title><style>.a{color:red}</style></head><body>"
        "<nav>Main menu Contents Random article</nav><div id='content'><h1>Quellbridge</h1>"
        f"<p>{FILLER}</p><p>Quellbridge is a market town on the river Tessaly.<sup>[1]</sup> "
        "The Tessaly flows into Orrin Bay.</p><script>var river = 'Tessaly';</script></div>"
        "<footer>Privacy policy</footer></body></html>"
    )),
    "/wiki/Orrin_Optics": ("Orrin Optics - Wikipedia", "Orrin Optics makes cameras.", (
        "<html><body><p>Orrin Optics is a camera maker founded by Dagny Halvorsen.</p></body></html>"
    )),
    "/wiki/Gone": ("Gone - Wikipedia", "A page that is gone; its snippet stands in.", None),
}


def provider_answer(provider: str, hits: list[tuple[str, str, str]], query: str) -> dict:
    """The answer each provider documents, holding `hits` (url, title, snippet)."""
    if provider == "google":
        items = [{"kind": "customsearch#result", "title": t, "link": u, "displayLink": "127.0.0.1", "snippet": s}
                 for u, t, s in hits]
        return {"kind": "customsearch#search", "queries": {"request": [{"searchTerms": query}]}, "items": items}
    if provider == "brave":
        results = [{"type": "search_result", "title": t, "url": u, "description": s} for u, t, s in hits]
        return {"type": "search", "query": {"original": query}, "web": {"type": "search", "results": results}}
    if provider in ("serper", "serpapi"):
        key = "organic" if provider == "serper" else "organic_results"
        found = [{"position": i + 1, "title": t, "link": u, "snippet": s} for i, (u, t, s) in enumerate(hits)]
        return {"searchParameters": {"q": query}, key: found}
    return {"query": query, "number_of_results": len(hits),
            "results": [{"url": u, "title": t, "content": s, "engine": "wikipedia"} for u, t, s in hits]}


class FakeWeb(LoopbackServer):
    """The five search APIs, told apart by method and path, each answering in its documented JSON
    with links to this server's `PAGES` (in that order); `override(seen)` may answer instead."""

    ROUTES: ClassVar[dict[tuple[str, str], str]] = {
        ("GET", "/customsearch/v1"): "google", ("GET", "/res/v1/web/search"): "brave", ("POST", "/search"): "serper",
        ("GET", "/search.json"): "serpapi", ("GET", "/search"): "searxng",
    }

    def __init__(self) -> None:
        super().__init__()
        self.override = None

    def env(self) -> dict[str, str]:
        """The endpoint variables that point every provider here."""
        return {"GOOGLE_CSE_URL": f"{self.base}/customsearch/v1", "BRAVE_URL": f"{self.base}/res/v1/web/search",
                "SERPER_URL": f"{self.base}/search", "SERPAPI_URL": f"{self.base}/search.json", "SEARXNG_URL": self.base}

    def searches(self) -> list[Seen]:
        return [r for r in self.requests if (r.method, r.path) in self.ROUTES]

    def pages_read(self) -> list[str]:
        return [r.path for r in self.requests if r.path in PAGES]

    def answer(self, seen: Seen) -> tuple[int, Any, str]:
        if self.override is not None and (answer := self.override(seen)) is not None:
            return answer
        if seen.path in PAGES:
            page = PAGES[seen.path][2]
            return (404, "not found", "text/plain") if page is None else (200, page, "text/html; charset=utf-8")
        provider = self.ROUTES.get((seen.method, seen.path))
        if provider is None:
            return 404, "not found", "text/plain"
        query = seen.body["q"] if provider == "serper" else seen.query["q"]
        hits = [(self.base + path, title, snippet) for path, (title, snippet, _) in PAGES.items()]
        return 200, provider_answer(provider, hits, query), "application/json"
