"""The outbound policy (`searchrl.outbound`): URLs from search results or a model reach only public
http(s) addresses, checked on every redirect hop and at connect time; every request ends by its
total deadline and reads at most its size cap; keys go only to the hosts they are meant for.

Only loopback servers are contacted: a fake resolver maps test names to addresses, and a fake
"internet" lands connections to one public-looking address on 127.0.0.1 (any other non-loopback
connection fails the test)."""

from __future__ import annotations

import datetime
import doctest
import ipaddress
import json
import socket
import ssl
import time

import httpcore
import httpx
import pytest
from loopback import DripServer, FakeOpenAI, FakeWeb, Routes

from searchrl import outbound
from searchrl.errors import RetrievalUnavailable, SearchRLError
from searchrl.judge import Judge, JudgeError, JudgeItem
from searchrl.outbound import KeyWithheld, OutboundRefused, check_public_url, client
from searchrl.retrieval.http import HttpRetriever, RetryConfig
from searchrl.retrieval.web import pages
from searchrl.retrieval.web.config import WebConfig
from searchrl.retrieval.web.pages import PageReader, PageUnreadable, read_page
from searchrl.retrieval.web.retriever import WebRetriever

PUBLIC = "93.184.216.34"  # a public address; the fake internet serves it from 127.0.0.1


@pytest.fixture
def dns(monkeypatch):
    """Names in the returned table resolve to their address; IP literals to themselves; any other
    name is unknown (no real DNS query is made)."""
    table: dict[str, str] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in table:
            return real(table[host], port, *args, **kwargs)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the test's resolver") from None
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


@pytest.fixture
def internet(monkeypatch):
    """Every address httpx dials, in order; PUBLIC is answered by 127.0.0.1."""
    real = httpcore.SyncBackend.connect_tcp
    dialled: list[str] = []

    def connect_tcp(self, host, port, *args, **kwargs):
        dialled.append(host)
        host = socket.getaddrinfo(host, port)[0][4][0]  # a name (private allowed) through the test's resolver
        host = "127.0.0.1" if host == PUBLIC else host
        assert ipaddress.ip_address(host).is_loopback, f"a test tried to reach {host}"
        return real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.SyncBackend, "connect_tcp", connect_tcp)
    return dialled


@pytest.fixture
def site():
    """A loopback site: a page, redirects to a loopback address, to a name, to file:, a big page."""
    server = Routes({})
    port = server.httpd.server_address[1]
    server.routes.update({
        "/page": (200, "<p>fine</p>", "text/html"),
        "/secret": (200, "<p>instance credentials</p>", "text/html"),
        "/to-loopback": (302, "", "text/plain", {"Location": f"http://127.0.0.1:{port}/secret"}),
        "/to-name": (302, "", "text/plain", {"Location": f"http://intranet.test:{port}/secret"}),
        "/to-public": (302, "", "text/plain", {"Location": f"http://news.test:{port}/page"}),
        "/to-file": (302, "", "text/plain", {"Location": "file:///etc/passwd"}),
        "/big": (200, "x" * 10_000, "text/plain"),
        "/gzip": (200, b"\x1f\x8b" + b"\0" * 20, "text/plain", {"Content-Encoding": "gzip"}),
    })
    yield server
    server.close()


def _url(server, name: str, path: str) -> str:
    return f"http://{name}:{server.httpd.server_address[1]}{path}"


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:8000/", "loopback"), ("http://10.0.0.1/", "private"), ("https://192.168.1.1/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"), ("http://[::1]/", "loopback"),
    ("http://[fd12::1]/", "private"), ("http://[::ffff:10.0.0.1]/", "private"), ("http://100.64.0.1/", "CGNAT"),
    ("http://224.0.0.1/", "multicast"), ("http://0.0.0.0/", "an unspecified"), ("http://240.0.0.1/", "private|reserved"),
    ("http://[fe80::1]/", "link-local"), ("http://localhost:99999/", "not a valid port"),
    ("file:///etc/passwd", "not file:"), ("ftp://example.org/x", "not ftp:"), ("data:text/plain,hi", "not data:"),
])
def test_check_public_url_refuses_other_schemes_and_non_public_addresses(dns, url, why):
    with pytest.raises(OutboundRefused, match=why) as err:
        check_public_url(url)
    assert "\n" not in str(err.value)


def test_check_public_url_passes_public_names_and_private_ones_when_allowed(dns):
    dns["news.test"] = PUBLIC
    check_public_url("https://news.test/a?b=c")
    check_public_url(f"http://{PUBLIC}/")
    check_public_url("http://10.0.0.1/", allow_private=True)
    with pytest.raises(OutboundRefused, match="file:"):
        check_public_url("file:///etc/passwd", allow_private=True)  # the scheme rule holds regardless
    with pytest.raises(OutboundRefused, match="cannot resolve nowhere.test"):
        check_public_url("http://nowhere.test/")


def test_a_private_url_is_refused_without_connecting(dns, internet, site):
    with client(5, public_only=True) as http:
        for url in ("http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/", site.base + "/page"):
            with pytest.raises(OutboundRefused, match="address: not fetched"):
                http.get(url)
        with pytest.raises(OutboundRefused, match="not file:"):
            http.get("file:///etc/passwd")
    assert internet == [] and site.requests == []


def test_a_name_resolving_to_loopback_is_refused(dns, internet, site):
    dns["intranet.test"] = "127.0.0.1"
    with client(5, public_only=True) as http, pytest.raises(OutboundRefused, match="intranet.test resolves to 127.0.0.1, a loopback"):
        http.get(_url(site, "intranet.test", "/page"))
    assert internet == [] and site.requests == []
    with client(5, public_only=False) as http:  # allowed: the same name is read
        assert http.get(_url(site, "intranet.test", "/page")).text == "<p>fine</p>"


@pytest.mark.parametrize("hop", ["/to-loopback", "/to-name"])
def test_a_redirect_to_a_private_address_is_refused_at_that_hop(dns, internet, site, hop):
    dns.update({"news.test": PUBLIC, "intranet.test": "127.0.0.1"})
    with client(5, public_only=True, follow_redirects=True) as http:
        assert http.get(_url(site, "news.test", "/to-public")).text == "<p>fine</p>"  # a public hop is followed
        with pytest.raises(OutboundRefused, match="loopback address"):
            http.get(_url(site, "news.test", hop))
    assert site.paths() == ["/to-public", "/page", hop]  # the secret was never asked for
    assert set(internet) == {PUBLIC}
    with client(5, follow_redirects=True) as http:  # private allowed: the redirect goes through
        assert http.get(_url(site, "news.test", hop)).text == "<p>instance credentials</p>"


def test_a_redirect_to_file_is_refused_and_a_page_fetch_falls_back(dns, internet, site, monkeypatch, tmp_path):
    dns["news.test"] = PUBLIC
    monkeypatch.setattr(pages, "_refusals_said", False)
    with client(5, public_only=True, follow_redirects=True) as http, \
            pytest.raises((OutboundRefused, httpx.UnsupportedProtocol)):
        http.get(_url(site, "news.test", "/to-file"))
    reader = PageReader(WebConfig(cache=str(tmp_path / "web.sqlite")))  # result pages: private not allowed
    try:
        with pytest.warns(pages.PageRefused, match="snippets stand in .*127.0.0.1 is a loopback address"):
            assert reader.text(_url(site, "news.test", "/to-loopback")) is None
        assert reader.text(_url(site, "news.test", "/to-name")) is None  # said once a process
    finally:
        reader.close()


def _certificates(folder, name: str) -> tuple[str, str, str]:
    """A test CA and a certificate for `name` signed by it: (CA file, certificate file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def issue(subject, key, issuer, issuer_key, ca: bool):
        now = datetime.datetime.now(datetime.timezone.utc)
        build = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
                 .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                 .not_valid_after(now + datetime.timedelta(days=1))
                 .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            build = build.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        return build.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "searchrl test CA")])
    ca = issue(ca_name, ca_key, ca_name, ca_key, True)
    cert = issue(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), key, ca_name, ca_key, False)
    files = [folder / "ca.pem", folder / "cert.pem", folder / "key.pem"]
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return tuple(str(f) for f in files)


def test_tls_still_verifies_the_url_host_name_on_the_checked_address(dns, internet, tmp_path, monkeypatch):
    pytest.importorskip("cryptography")
    ca, cert, key = _certificates(tmp_path, "news.test")
    monkeypatch.setenv("SSL_CERT_FILE", ca)  # trusted by clients made from here on
    dns.update({"news.test": PUBLIC, "other.test": PUBLIC})
    server = Routes({"/": (200, "over tls", "text/plain")})
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server.httpd.socket = tls.wrap_socket(server.httpd.socket, server_side=True)
    try:
        with client(5, public_only=True) as http:
            assert http.get(_url(server, "news.test", "/").replace("http:", "https:")).text == "over tls"
            with pytest.raises(httpx.ConnectError, match="certificate verify failed"):  # the certificate is for news.test
                http.get(_url(server, "other.test", "/").replace("http:", "https:"))
    finally:
        server.close()
    assert internet == [PUBLIC, PUBLIC]  # dialled by address, verified by name


@pytest.fixture
def body_drip():
    server = DripServer(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100\r\n\r\n", b"x" * 100)
    yield server
    server.close()


@pytest.mark.parametrize("part", ["body", "headers"])
def test_a_dribbling_server_is_cut_at_the_total_deadline(part):
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
    head, body = (response[:-100], response[-100:]) if part == "body" else (b"", response)
    server = DripServer(head, body, interval_s=0.2)  # 20 s in all; a byte every 0.2 s beats any per-read timeout
    try:
        with client(1.0) as http:
            started = time.monotonic()
            with pytest.raises(httpx.TimeoutException, match="total deadline of 1 s"):
                http.get(server.base + "/slow")
            assert 0.9 < time.monotonic() - started < 1.6
            started = time.monotonic()
            with pytest.raises(PageUnreadable):  # a page fetch gives up alike
                read_page(http, server.base + "/slow", 10_000)
            assert time.monotonic() - started < 1.6
    finally:
        server.close()


def test_the_retrieval_client_has_a_total_deadline_too(body_drip):
    r = HttpRetriever(body_drip.base, timeout=1.0, retry=RetryConfig(retries=0))
    started = time.monotonic()
    with pytest.raises(RetrievalUnavailable, match="client's total deadline"):
        r.search(["q"], 1)
    assert 0.9 < time.monotonic() - started < 1.6
    r.close()


def test_answers_over_the_cap_are_refused_and_a_page_is_cut_at_it(site):
    with client(5, max_bytes=1000) as http:
        with pytest.raises(OutboundRefused, match="more than 1000 bytes"):
            http.get(site.base + "/big")
        assert read_page(http, site.base + "/big", 1000) == "x" * 1000  # a streamed read stops at the cap
        with pytest.raises(OutboundRefused, match="gzip-compressed"):
            http.get(site.base + "/gzip")  # its size in memory could not be capped
        assert http.get(site.base + "/page").headers["content-type"] == "text/html"
    assert site.requests[0].headers["accept-encoding"] == "identity"


def test_the_retrieval_client_refuses_an_answer_over_its_cap():
    big = {"results": [[{"id": "p", "title": "t", "text": "x" * 5000, "score": 1.0}]]}
    server = Routes({"/search": (200, big, "")})
    try:
        r = HttpRetriever(server.base, max_bytes=1000)
        with pytest.raises(SearchRLError, match="more than 1000 bytes"):
            r.search(["q"], 1)
        assert len(server.requests) == 1  # not retried
        assert HttpRetriever(server.base).search(["q"], 1)[0][0].text == "x" * 5000
    finally:
        server.close()


# ------------------------------------------------------------------------------ keys


def test_key_allowed_follows_scheme_host_and_the_users_list(monkeypatch):
    own = {"api.openai.com"}
    assert outbound.key_allowed("https://api.openai.com/v1/chat/completions", own)
    assert not outbound.key_allowed("http://api.openai.com/v1", own)  # never in the clear
    assert not outbound.key_allowed("https://api.openai.com.evil.example/v1", own)
    assert not outbound.key_allowed("https://127.0.0.1/v1", own)
    assert not outbound.key_allowed("https://retrieval.example", user_server=True)
    assert outbound.key_allowed("http://localhost:8000", user_server=True)
    assert not outbound.key_allowed("http://retrieval.example:8000", user_server=True)
    monkeypatch.setenv("SEARCHRL_KEY_HOSTS", " gpu-box.lan , LLM.example ")
    assert outbound.key_allowed("http://gpu-box.lan:8000/v1", own) and outbound.key_allowed("https://llm.example", own)
    assert not outbound.key_allowed("http://other.lan/v1", own)


ITEM = JudgeItem("Capital of France?", ("Paris",), "Paris")


@pytest.fixture
def llm(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.delenv("SEARCHRL_KEY_HOSTS", raising=False)
    server = FakeOpenAI()
    yield server
    server.close()


def test_the_judge_sends_no_key_to_an_unlisted_http_host_and_says_so(llm, monkeypatch):
    with pytest.warns(KeyWithheld, match=r"OPENAI_API_KEY is not sent to http://127.0.0.1:\d+/v1 .*add 127.0.0.1 to SEARCHRL_KEY_HOSTS"):
        judge = Judge(llm.url)
    assert judge.judge_one(ITEM) is True  # the keyless endpoint still works
    assert "authorization" not in llm.requests[-1].headers
    llm.status = 401
    with pytest.raises(JudgeError, match="withheld from this host: add it to SEARCHRL_KEY_HOSTS"):
        judge.judge_one(JudgeItem("Other?", ("x",), "y"))
    llm.status = 200
    monkeypatch.setenv("SEARCHRL_KEY_HOSTS", "127.0.0.1")
    Judge(llm.url).judge_one(ITEM)
    assert llm.requests[-1].headers["authorization"] == "Bearer sk-secret"


def test_the_condenser_key_follows_the_same_rule(llm, monkeypatch, tmp_path):
    web = FakeWeb()
    monkeypatch.setenv("SEARXNG_URL", web.base)
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path))
    llm.reply = "Quellbridge lies on the Tessaly."
    condense = {"method": "llm", "url": llm.url, "model": "mini"}
    try:
        with pytest.warns(KeyWithheld, match="the page condenser"):
            r = WebRetriever(WebConfig(provider="searxng", allow_private=True, condense=condense, budget={"requests_per_s": 0}))
        with r:
            r.search(["Quellbridge"], 1)
    finally:
        web.close()
    assert llm.requests and all("authorization" not in s.headers for s in llm.requests)


@pytest.mark.parametrize(("provider", "header"), [("brave", "x-subscription-token"), ("serper", "x-api-key")])
def test_a_providers_key_goes_only_to_a_listed_host_when_moved(monkeypatch, tmp_path, provider, header):
    web = FakeWeb()
    for name, value in web.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(f"{provider.upper()}_API_KEY", "key-1")
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path))
    monkeypatch.delenv("SEARCHRL_KEY_HOSTS", raising=False)
    cfg = WebConfig(provider=provider, pages=False, budget={"requests_per_s": 0})
    try:
        with pytest.warns(KeyWithheld, match=rf"web search provider {provider}: the key in {provider.upper()}_API_KEY is not sent"):
            r = WebRetriever(cfg)
        with r:
            r.search(["q1"], 1)
        monkeypatch.setenv("SEARCHRL_KEY_HOSTS", "127.0.0.1")
        with WebRetriever(cfg) as r:
            r.search(["q2"], 1)
    finally:
        web.close()
    first, second = web.searches()
    assert header not in first.headers and second.headers[header] == "key-1"


def test_googles_key_parameter_is_left_out_when_withheld(monkeypatch, tmp_path):
    web = FakeWeb()
    monkeypatch.setenv("GOOGLE_CSE_URL", web.env()["GOOGLE_CSE_URL"])
    monkeypatch.setenv("GOOGLE_API_KEY", "g-key")
    monkeypatch.setenv("GOOGLE_CSE_ID", "cx-1")
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path))
    monkeypatch.delenv("SEARCHRL_KEY_HOSTS", raising=False)
    try:
        with pytest.warns(KeyWithheld), WebRetriever(WebConfig(provider="google", pages=False, budget={"requests_per_s": 0})) as r:
            r.search(["q"], 1)
    finally:
        web.close()
    (seen,) = web.searches()
    assert "key" not in seen.query and seen.query["cx"] == "cx-1"


@pytest.fixture
def retrieval_server():
    answer = {"results": [[{"id": "p1", "title": "T", "text": "text", "score": 1.0}]]}
    server = Routes({"/search": (200, answer, "")})
    yield server
    server.close()


def test_the_retrieval_client_sends_its_bearer_token_under_the_key_policy(retrieval_server, dns, monkeypatch):
    monkeypatch.setenv("RETRIEVAL_TOKEN", "tok-1")
    monkeypatch.delenv("SEARCHRL_KEY_HOSTS", raising=False)
    with HttpRetriever(retrieval_server.base, api_key_env="RETRIEVAL_TOKEN") as r:  # loopback: sent
        assert r.search(["q"], 1)[0][0].id == "p1"
    assert retrieval_server.requests[-1].headers["authorization"] == "Bearer tok-1"
    dns["retrieval.test"] = "127.0.0.1"
    by_name = _url(retrieval_server, "retrieval.test", "")
    with pytest.warns(KeyWithheld, match="the retrieval client: the key in RETRIEVAL_TOKEN is not sent"):
        r = HttpRetriever(by_name, api_key_env="RETRIEVAL_TOKEN")  # plain http to a name: withheld
    r.search(["q"], 1)
    assert "authorization" not in retrieval_server.requests[-1].headers
    monkeypatch.setenv("SEARCHRL_KEY_HOSTS", "retrieval.test")
    HttpRetriever(by_name, api_key_env="RETRIEVAL_TOKEN").search(["q"], 1)
    assert retrieval_server.requests[-1].headers["authorization"] == "Bearer tok-1"
    HttpRetriever(retrieval_server.base).search(["q"], 1)  # no api_key_env: no header
    assert "authorization" not in retrieval_server.requests[-1].headers


def test_the_retrieval_token_variable_must_be_set_and_a_401_says_what_to_do(retrieval_server, monkeypatch):
    monkeypatch.delenv("RETRIEVAL_TOKEN", raising=False)
    with pytest.raises(SearchRLError, match="retrieval.api_key_env names RETRIEVAL_TOKEN, which is not set"):
        HttpRetriever(retrieval_server.base, api_key_env="RETRIEVAL_TOKEN")
    retrieval_server.routes["/search"] = (401, json.dumps({"detail": "missing or wrong bearer token"}), "application/json")
    with pytest.raises(SearchRLError, match="HTTP 401: missing or wrong bearer token.*set retrieval.api_key_env"):
        HttpRetriever(retrieval_server.base).search(["q"], 1)
    monkeypatch.setenv("RETRIEVAL_TOKEN", "wrong")
    with pytest.raises(SearchRLError, match="check the token in RETRIEVAL_TOKEN"):
        HttpRetriever(retrieval_server.base, api_key_env="RETRIEVAL_TOKEN").search(["q"], 1)


def test_retrieval_config_passes_the_token_variable(retrieval_server, monkeypatch):
    from searchrl.retrieval import RetrievalConfig

    monkeypatch.setenv("RETRIEVAL_TOKEN", "tok-2")
    with RetrievalConfig(url=retrieval_server.base, api_key_env="RETRIEVAL_TOKEN").open() as r:
        r.search(["q"], 1)
    assert retrieval_server.requests[-1].headers["authorization"] == "Bearer tok-2"


def test_doctests_pass():
    assert doctest.testmod(outbound).failed == 0
