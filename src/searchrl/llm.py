"""A small client for OpenAI-compatible chat models (`POST {base_url}/chat/completions`): the ACC_L
judge and the web page condenser both ask one. Any such server works (OpenAI, vLLM, llama.cpp,
a loopback fake in the tests).

The API key is sent only over https to api.openai.com, or to a host listed in $SEARCHRL_KEY_HOSTS
(`searchrl.outbound.key_allowed`): a config file naming another URL gets no key.

Transient failures (refused connections, 408/409/429/5xx) are retried with exponential backoff;
a refusal (401/403), a wrong URL (404) or other 4xx stops at once with what to fix. A 200 reply
that is not a chat completion is returned as None: the caller counts it, the run goes on.
"""

from __future__ import annotations

import os
import threading
import time
from urllib.parse import urlparse

import httpx

from searchrl.errors import SearchRLError
from searchrl.outbound import KEY_HOSTS_ENV, key_allowed, withheld

OPENAI_HOST = "api.openai.com"

# Worth retrying: rate limits, overloaded or restarting servers, gateway hiccups.
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ChatError(SearchRLError):
    """The chat API could not be used; the message names the URL and what to check."""


class ChatClient:
    """One model behind one endpoint; thread-safe (share one `searchrl.outbound.client` between threads).
    `role` names it in errors ("the judge"); `flag` is the setting that holds the URL.

    >>> ChatClient("http://127.0.0.1:9/v1", "m").endpoint
    'http://127.0.0.1:9/v1/chat/completions'
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        *,
        role: str = "the chat model",
        flag: str = "its URL",
        max_retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.endpoint = f"{self.base_url}/chat/completions"
        self.model, self.key_env, self.role = model, api_key_env, role
        self.api_key = os.environ.get(api_key_env) or None
        if not self.api_key and urlparse(self.base_url).hostname == OPENAI_HOST:
            raise ChatError(
                f"{role} at {self.base_url} needs an API key: set {api_key_env}, "
                f"or point {flag} at a local OpenAI-compatible server"
            )
        self.withheld = bool(self.api_key) and not key_allowed(self.endpoint, {OPENAI_HOST})
        if self.withheld:
            withheld(role, api_key_env, self.base_url, f"only over https to {OPENAI_HOST}")
            self.api_key = None
        self.max_retries, self.backoff_s, self.timeout_s = max_retries, backoff_s, timeout_s
        self.requests = 0  # HTTP requests sent, retries included
        self._count = threading.Lock()

    def complete(self, client: httpx.Client, messages: list[dict[str, str]], max_tokens: int) -> str | None:
        """The reply's text, or None when a 200 answer is not a chat completion."""
        body = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            with self._count:
                self.requests += 1
            try:
                resp = client.post(self.endpoint, json=body, headers=headers)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            self._raise_for(resp)
            try:
                return resp.json()["choices"][0]["message"]["content"] or ""
            except (ValueError, KeyError, IndexError, TypeError):
                return None
        raise ChatError(
            f"{self.role} at {self.endpoint} did not answer after {self.max_retries + 1} tries "
            f"(last: {last}); is the server up and reachable?"
        )

    def _raise_for(self, resp: httpx.Response) -> None:
        if resp.status_code in (401, 403):
            fix = (f"the key in {self.key_env} was withheld from this host: add it to {KEY_HOSTS_ENV} to send it"
                   if self.withheld else f"check {self.key_env}")
            raise ChatError(f"{self.role} at {self.endpoint} refused the request (HTTP {resp.status_code}); {fix}")
        if resp.status_code == 404:
            raise ChatError(
                f"{self.endpoint} answered 404: the base URL should end where /chat/completions "
                f"begins (often .../v1), and the server must serve model {self.model!r}"
            )
        if resp.status_code >= 400:
            raise ChatError(f"{self.role} at {self.endpoint} answered HTTP {resp.status_code}: {resp.text[:300]}")
