"""ACC_L: an LLM judge that says whether a predicted answer is correct, over an OpenAI-compatible API.

The paper asks gpt-4o-mini; any server that speaks `POST {base_url}/chat/completions` works
(OpenAI, vLLM, llama.cpp, a local fake in the tests). Verdicts are True/False; a reply that says
neither becomes None, so a chatty judge lowers coverage instead of silently counting as wrong.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx

from searchrl.errors import SearchRLError

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"

SYSTEM_PROMPT = (
    "You grade answers to questions. You are given a question, one or more gold answers that are "
    "all acceptable, and a predicted answer. Decide whether the predicted answer is correct: it "
    "must mean the same thing as at least one gold answer; wording, casing and extra detail that "
    "does not contradict the gold answer are fine. Reply with exactly one word: True or False."
)
USER_TEMPLATE = (
    "Question: {question}\nGold answer(s): {golds}\nPredicted answer: {prediction}\nCorrect?"
)

_VERDICT_WORD = re.compile(r"\b(true|false|yes|no|correct|incorrect)\b")
_VERDICT_VALUE = {
    "true": True,
    "yes": True,
    "correct": True,
    "false": False,
    "no": False,
    "incorrect": False,
}
# Worth retrying: rate limits, overloaded or restarting servers, gateway hiccups.
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class JudgeError(SearchRLError):
    """The judge API could not be used; the message names the URL and what to check."""


@dataclass(frozen=True)
class JudgeItem:
    question: str
    golds: tuple[str, ...]
    prediction: str | None


def parse_verdict(reply: str) -> bool | None:
    """Read True/False from a judge reply; the first verdict word wins, None when there is none.

    >>> parse_verdict("True"), parse_verdict(" **False**."), parse_verdict("Verdict: incorrect")
    (True, False, False)
    >>> parse_verdict("I cannot tell") is None
    True
    """
    found = _VERDICT_WORD.search(reply.lower())
    return _VERDICT_VALUE[found.group(1)] if found else None


def build_messages(item: JudgeItem) -> list[dict[str, str]]:
    user = USER_TEMPLATE.format(
        question=item.question.strip(),
        golds=" | ".join(g.strip() for g in item.golds),
        prediction=(item.prediction or "").strip(),
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class Judge:
    """A thread-pooled, retrying client for one judge model.

    >>> Judge(base_url="http://127.0.0.1:9/v1").endpoint
    'http://127.0.0.1:9/v1/chat/completions'
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        *,
        workers: int = 4,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
        max_tokens: int = 16,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.endpoint = f"{self.base_url}/chat/completions"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if not self.api_key and urlparse(self.base_url).hostname == "api.openai.com":
            raise JudgeError(
                f"the judge at {self.base_url} needs an API key: set OPENAI_API_KEY, "
                "or point --judge-url at a local OpenAI-compatible server"
            )
        self.workers = max(1, workers)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _complete(self, client: httpx.Client, messages: list[dict[str, str]]) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                resp = client.post(self.endpoint, json=body, headers=self._headers())
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code in (401, 403):
                raise JudgeError(
                    f"the judge at {self.endpoint} refused the request (HTTP {resp.status_code}); "
                    "check OPENAI_API_KEY"
                )
            if resp.status_code == 404:
                raise JudgeError(
                    f"{self.endpoint} answered 404: the base URL should end where /chat/completions "
                    f"begins (often .../v1), and the server must serve model {self.model!r}"
                )
            if resp.status_code >= 400:
                raise JudgeError(
                    f"the judge at {self.endpoint} answered HTTP {resp.status_code}: {resp.text[:300]}"
                )
            try:
                return resp.json()["choices"][0]["message"]["content"] or ""
            except (ValueError, KeyError, IndexError, TypeError):
                raise JudgeError(
                    f"the judge at {self.endpoint} sent a reply that is not a chat completion: {resp.text[:300]}"
                ) from None
        raise JudgeError(
            f"the judge at {self.endpoint} did not answer after {self.max_retries + 1} tries "
            f"(last: {last}); is the server up and reachable?"
        )

    def judge_one(self, item: JudgeItem, client: httpx.Client | None = None) -> bool | None:
        # An empty prediction is wrong whatever the judge would say; no call is spent on it.
        if item.prediction is None or not item.prediction.strip():
            return False
        if client is None:
            with httpx.Client(timeout=self.timeout_s) as own:
                return parse_verdict(self._complete(own, build_messages(item)))
        return parse_verdict(self._complete(client, build_messages(item)))

    def judge_many(self, items: Sequence[JudgeItem], progress: bool = False) -> list[bool | None]:
        """Verdicts in the order of `items`; the first hard error stops the batch and is raised."""
        verdicts: list[bool | None] = [None] * len(items)
        with httpx.Client(timeout=self.timeout_s) as client:
            pool = ThreadPoolExecutor(max_workers=self.workers)
            try:
                futures = {pool.submit(self.judge_one, it, client): i for i, it in enumerate(items)}
                done = as_completed(futures)
                if progress:
                    from tqdm import tqdm

                    done = tqdm(done, total=len(futures), desc="judging", unit="answer")
                for fut in done:
                    verdicts[futures[fut]] = fut.result()
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        return verdicts
