"""`searchrl ask "QUESTION"`: watch a model search while it reasons, live in the terminal.

The rollout is the engine's own (`RolloutEngine`), so what is shown is exactly what evaluation and
training do. Two thin wrappers let the view follow it:

- `StreamingBackend` serves each `generate` call as a series of small ones (`chunk` tokens each)
  and hands the new text to a callback after every piece. The transformers backend carries its
  cache and its stop-string window across calls, so the pieces add up to the same continuation
  one call would have produced (greedy: token for token).
- `AnnouncingRetriever` reports every batched search (queries and the passages found).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from pydantic import Field, field_validator

from searchrl.agent import AgentConfig, build_agent
from searchrl.data.trajectory import Trajectory
from searchrl.data.types import Passage, Question
from searchrl.display import visible
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.base import Retriever
from searchrl.rollout.backend import (
    Continuation,
    GenerationBackend,
    SamplingParams,
    per_sequence_budgets,
)
from searchrl.rollout.config import EVAL_ROLLOUT, EvalRollout, RolloutConfig


class StreamingBackend(GenerationBackend):
    """Delegates to `inner`; `generate` runs in pieces of `chunk` tokens and calls
    `on_text(handle, text)` with each piece's new text (EOS tokens left out; a character split
    across pieces waits for its last byte)."""

    def __init__(self, inner: GenerationBackend, on_text: Callable[[int, str], None], chunk: int = 4) -> None:
        self.inner = inner
        self.on_text = on_text
        self.chunk = chunk
        self.stats = inner.stats

    def encode(self, text: str, *, prompt: bool = False) -> list[int]:
        return self.inner.encode(text, prompt=prompt)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.inner.decode(token_ids)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.inner.eos_token_ids

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    @property
    def max_context(self) -> int | None:
        return self.inner.max_context

    def start(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[int]:
        return self.inner.start(prompts, params)

    def append(self, handles: Sequence[int], token_ids: Sequence[Sequence[int]]) -> None:
        self.inner.append(handles, token_ids)

    def release(self, handles: Sequence[int]) -> None:
        self.inner.release(handles)

    def close(self) -> None:
        self.inner.close()

    def sync_weights(self, model) -> None:
        self.inner.sync_weights(model)

    def generate(
        self,
        handles: Sequence[int],
        max_new_tokens: int | Sequence[int],
        stop: Sequence[str] = (),
        quorum: float = 1.0,
    ) -> list[Continuation]:
        # `quorum` is ignored: the view follows one question, every piece runs to its end.
        handles = list(handles)
        budgets = per_sequence_budgets(handles, max_new_tokens)
        results = [Continuation([], [], "length") for _ in handles]
        shown = [0] * len(handles)  # characters of each continuation already handed out
        todo = [i for i, b in enumerate(budgets) if b > 0]
        while todo:
            outs = self.inner.generate(
                [handles[i] for i in todo],
                [min(self.chunk, budgets[i] - len(results[i].token_ids)) for i in todo],
                stop,
            )
            for i, o in zip(todo, outs):
                r = results[i]
                r.token_ids.extend(o.token_ids)
                r.logprobs.extend(o.logprobs)
                r.finish_reason, r.stop_string = o.finish_reason, o.stop_string
                shown[i] = self._emit(handles[i], r.token_ids, shown[i], final=o.finish_reason != "length")
            todo = [i for i in todo if results[i].finish_reason == "length" and len(results[i].token_ids) < budgets[i]]
        for i in range(len(handles)):  # flush what a budget cut left waiting
            self._emit(handles[i], results[i].token_ids, shown[i], final=True)
        return results

    def _emit(self, handle: int, ids: list[int], shown: int, final: bool) -> int:
        text = self.inner.decode([t for t in ids if t not in self.inner.eos_token_ids])
        if not final:
            text = text.rstrip("\ufffd")  # an incomplete UTF-8 sequence decodes to U+FFFD
        if len(text) > shown:
            self.on_text(handle, text[shown:])
            return len(text)
        return shown


class AnnouncingRetriever(Retriever):
    """Delegates to `inner` and calls `on_search(queries, results)` after every search."""

    def __init__(self, inner: Retriever, on_search: Callable[[list[str], list[list[Passage]]], None]) -> None:
        self.inner = inner
        self.on_search = on_search

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        results = self.inner.search(queries, k)
        self.on_search(list(queries), results)
        return results

    def close(self) -> None:
        self.inner.close()


class AskConfig(AgentConfig):
    """One question answered live: `searchrl ask QUESTION [--config FILE] [flags]`."""

    rollout: EvalRollout = Field(
        default_factory=lambda: RolloutConfig(**EVAL_ROLLOUT),
        description="Generation as in evaluation: greedy, k=5, at most 8 searches and 512 policy tokens. "
        "greedy=false (--sample) samples with temperature and top_p, seeded by seed (--seed).",
    )
    retrieval: RetrievalConfig = Field(
        default_factory=lambda: RetrievalConfig(index="toyworld"), description="Index or retrieval server; the toy world's index by default."
    )

    @field_validator("retrieval")
    @classmethod
    def _searches(cls, v: RetrievalConfig) -> RetrievalConfig:
        if v.source is None:
            raise ValueError("ask searches: give an index (e.g. --index toyworld), a retriever URL (e.g. --retriever-url http://127.0.0.1:8000) or --web PROVIDER")
        return v


def ask(
    question: str,
    cfg: AskConfig | None = None,
    *,
    as_json: bool = False,
    console=None,
    backend: GenerationBackend | None = None,
    chunk: int = 4,
) -> Trajectory:
    """Answer one question with search (`cfg`: `AskConfig()` when None); show it live on `console`
    (rich) unless `as_json`, which prints the trajectory as one JSON object instead. `backend` may
    be passed to reuse a loaded model; `chunk` is how many tokens appear at a time (the backend
    must match stop strings across calls, as the transformers one does)."""
    cfg = cfg or AskConfig()
    agent = build_agent(cfg, backend)
    q = Question("ask", question, ())
    try:
        if as_json:
            traj = agent.engine.run([q])[0]
            print(json.dumps(traj.to_dict(), ensure_ascii=False))
            return traj
        view = _LiveView(console, agent.protocol)
        view.header(question, cfg.model, cfg.retrieval.source, sample=not cfg.rollout.greedy)
        shown = build_agent(
            cfg, StreamingBackend(agent.backend, view.text, chunk), AnnouncingRetriever(agent.retriever, view.search)
        )
        started = time.perf_counter()
        traj = shown.engine.run([q])[0]
        view.finish(traj, time.perf_counter() - started, agent.retriever.usage())
        return traj
    finally:
        agent.close()


def ask_command(question: str, config: str | None, flags: dict, as_json: bool = False) -> Trajectory:
    """`searchrl ask`: YAML file, then the explicit flags (keyed by their config keys) win."""
    from searchrl.config import flag_overrides, load_config

    return ask(question, load_config(AskConfig, config, flag_overrides(flags)), as_json=as_json)


class _LiveView:
    """Thinking streams as plain text; queries and answers get panels. Model output, questions
    and passage titles are untrusted: shown through `visible`, never read as markup."""

    def __init__(self, console, protocol) -> None:
        if console is None:
            from rich.console import Console

            console = Console()
        self.console = console
        self.protocol = protocol
        self.n_search = 0

    def header(self, question: str, model: str, retriever: str, sample: bool) -> None:
        from rich.panel import Panel
        from rich.text import Text

        mode = "sampling" if sample else "greedy"
        subtitle = Text(visible(f"{model} · {retriever} · {mode}", keep_newlines=False))
        self.console.print(
            Panel(Text(visible(question)), title="question", subtitle=subtitle, border_style="blue"),
            highlight=False,
        )

    def text(self, handle: int, text: str) -> None:
        from rich.text import Text

        self.console.print(Text(visible(text), style="dim"), end="", soft_wrap=True)

    def search(self, queries: list[str], results: list[list[Passage]]) -> None:
        from rich.panel import Panel
        from rich.text import Text

        for query, passages in zip(queries, results):
            self.n_search += 1
            self.console.print()
            self.console.print(
                Panel(Text(visible(query), style="bold yellow"), title=f"search {self.n_search}", border_style="yellow", expand=False)
            )
            found = Text()
            for i, p in enumerate(passages, start=1):
                found.append(f"  {i}. ", style="bold")
                found.append(visible(p.title, keep_newlines=False))
                found.append(f"  [{visible(p.id, keep_newlines=False)}]\n", style="dim")
            self.console.print(found if passages else Text("  (no documents found)", style="dim"), end="")

    def finish(self, traj: Trajectory, seconds: float, spent: dict | None = None) -> None:
        from rich.panel import Panel
        from rich.text import Text

        self.console.print()
        if traj.answer is not None:
            body, style = Text(visible(traj.answer), style="bold green"), "green"
        else:
            body, style = Text(f"no answer (stopped: {traj.stop_reason})", style="red"), "red"
        self.console.print(Panel(body, title="answer", border_style=style, expand=False))
        searches = f"{traj.n_searches} search" + ("" if traj.n_searches == 1 else "es")
        web = ""
        if spent is not None:  # web search: what this question cost
            web = f" · web: {spent['requests']} requests, {spent['cache_hits']} from cache, ${spent['cost_usd']:.3f}"
        self.console.print(f"{searches} · {sum(traj.loss_mask)} tokens generated · {seconds:.1f}s{web}", style="dim", highlight=False)
