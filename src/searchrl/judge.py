"""ACC_L: an LLM judge that says whether a predicted answer is correct, over an OpenAI-compatible API.

The paper asks gpt-4o-mini; any server that speaks `POST {base_url}/chat/completions` works
(`searchrl.llm`). Verdicts are True/False; a reply that says neither (or is not a chat
completion) becomes None and is counted as malformed, so a chatty judge lowers coverage instead
of silently counting as wrong or stopping the run. Verdicts are cached on disk by (judge model,
prompt, question, gold answers, prediction): scoring the same predictions again asks nothing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import Field

from searchrl import outbound
from searchrl.config import StrictModel
from searchrl.llm import ChatClient, ChatError
from searchrl.sqlcache import SqliteStore, digest

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
# Part of every cache key: editing the prompt must not serve verdicts given to the old one.
_PROMPT_ID = digest(SYSTEM_PROMPT, USER_TEMPLATE)[:16]

_VERDICT_WORD = re.compile(r"\b(true|false|yes|no|correct|incorrect)\b")
_VERDICT_VALUE = {
    "true": True,
    "yes": True,
    "correct": True,
    "false": False,
    "no": False,
    "incorrect": False,
}
JudgeError = ChatError  # the judge API could not be used; the message names the URL and what to check


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



class JudgeConfig(StrictModel):
    """The ACC_L judge of an evaluation run (`eval run --judge-url URL --judge-model NAME`)."""

    url: str | None = Field(
        None, description="OpenAI-compatible base URL (…/v1) of the judge; null = no judge (ACC_L n/a). "
        "The paper's judge is gpt-4o-mini at https://api.openai.com/v1.",
    )
    model: str = Field(DEFAULT_MODEL, description="Judge model name (paper: gpt-4o-mini).")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key (keys are never written into configs); it is "
        "sent only over https to api.openai.com or to a host listed in $SEARCHRL_KEY_HOSTS.",
    )
    workers: int = Field(4, ge=1, description="Requests in flight at once: raise it for a fast local judge, lower it under a rate limit.")
    max_retries: int = Field(4, ge=0, description="Retries of a request that failed on the way (refused, 429, 5xx).")
    backoff_s: float = Field(1.0, ge=0, description="Wait before the first retry; doubled for each next one.")
    timeout_s: float = Field(60.0, gt=0, description="Seconds one request may take in all (its whole answer read).")
    cache: str | None = Field(
        None, description="SQLite file of cached verdicts, shared by runs and processes; null = $SEARCHRL_HOME/judge-cache.sqlite.",
    )

    def build(self, flag: str = "--judge-url") -> Judge:
        """The judge this config describes; `flag` names the URL setting in errors."""
        from searchrl.paths import cache_dir

        return Judge(
            self.url or DEFAULT_BASE_URL, self.model, self.api_key_env, flag=flag, workers=self.workers,
            max_retries=self.max_retries, backoff_s=self.backoff_s, timeout_s=self.timeout_s,
            cache=self.cache or cache_dir() / "judge-cache.sqlite",
        )


@dataclass
class JudgeStats:
    """What judging has cost so far: HTTP requests (retries included), verdicts served from the
    cache, replies that held no verdict."""

    requests: int = 0
    cache_hits: int = 0
    malformed: int = 0


class Judge:
    """A thread-pooled, retrying, caching client for one judge model; the API key is read from
    the environment variable `api_key_env`. `cache`: a SQLite file, or None for no cache.

    >>> Judge(base_url="http://127.0.0.1:9/v1").chat.endpoint
    'http://127.0.0.1:9/v1/chat/completions'
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        model: str = DEFAULT_MODEL,
        api_key_env: str = "OPENAI_API_KEY",
        *,
        flag: str = "--judge-url",
        workers: int = 4,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
        max_tokens: int = 16,
        cache: str | Path | None = None,
    ) -> None:
        self.chat = ChatClient(
            base_url, model, api_key_env, role="the judge", flag=flag,
            max_retries=max_retries, backoff_s=backoff_s, timeout_s=timeout_s,
        )
        self.model = model
        self.workers = max(1, workers)
        self.max_tokens = max_tokens
        self.cache = SqliteStore(cache) if cache is not None else None
        self._stats = JudgeStats()
        self._lock = threading.Lock()

    @property
    def stats(self) -> JudgeStats:
        with self._lock:
            return JudgeStats(self.chat.requests, self._stats.cache_hits, self._stats.malformed)

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self._stats, field, getattr(self._stats, field) + 1)

    def judge_one(self, item: JudgeItem, client: httpx.Client | None = None) -> bool | None:
        # An empty prediction is wrong whatever the judge would say; no call is spent on it.
        if item.prediction is None or not item.prediction.strip():
            return False
        key = digest(self.model, _PROMPT_ID, item.question, item.golds, item.prediction)
        cached = self.cache.get("verdict", key) if self.cache is not None else None
        if cached is not None:
            self._count("cache_hits")
            return cached == "true"
        if client is None:
            with outbound.client(self.chat.timeout_s) as own:
                reply = self.chat.complete(own, build_messages(item), self.max_tokens)
        else:
            reply = self.chat.complete(client, build_messages(item), self.max_tokens)
        verdict = None if reply is None else parse_verdict(reply)
        if verdict is None:  # not cached: a later run asks again
            self._count("malformed")
        elif self.cache is not None:
            self.cache.put("verdict", key, "true" if verdict else "false")
        return verdict

    def judge_many(self, items: Sequence[JudgeItem], progress: bool = False) -> list[bool | None]:
        """Verdicts in the order of `items`; the first hard error stops the batch and is raised."""
        verdicts: list[bool | None] = [None] * len(items)
        with outbound.client(self.chat.timeout_s) as client:
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

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
