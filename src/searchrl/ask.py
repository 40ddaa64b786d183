"""`searchrl ask "QUESTION"`: watch a model search while it reasons, live in the terminal.

The rollout is the engine's own (`RolloutEngine`), so what is shown is exactly what evaluation and
training do. Two thin wrappers let the view follow it:

- `StreamingBackend` serves each `generate` call as a series of small ones (`chunk` tokens each)
  and hands the new text to a callback after every piece. The transformers backend carries its
  cache and its stop-string window across calls, so the pieces add up to the same continuation
  one call would have produced (greedy: token for token).
- `AnnouncingTool` reports every batched call of a tool (arguments and observations): searches
  in the tag protocols, any tool's calls in the tool-call format.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from searchrl.data.trajectory import Trajectory
from searchrl.data.types import Question
from searchrl.display import visible
from searchrl.errors import SearchRLError
from searchrl.profiles import announce
from searchrl.rollout.agent import AgentConfig, AgentDefaults, build_agent
from searchrl.rollout.backend import (
    Continuation,
    GenerationBackend,
    SamplingParams,
    per_sequence_budgets,
)
from searchrl.rollout.config import EVAL_ROLLOUT
from searchrl.tools.base import Observation, Tool

OBSERVATION_LINES = 6  # lines of a tool's result the live view shows


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


class AnnouncingTool(Tool):
    """Delegates to `inner`; calls `on_call(name, arguments, observations)` after every batch."""

    def __init__(self, inner: Tool, on_call: Callable[[str, list[dict], list[Observation]], None]) -> None:
        super().__init__(inner.context)
        self.inner, self.on_call = inner, on_call
        self.name, self.description, self.parameters = inner.name, inner.description, inner.parameters
        self.timeout_s = inner.timeout_s

    def call(self, calls: Sequence[dict[str, Any]]) -> list[Observation]:
        observations = self.inner.call(calls)
        self.on_call(self.name, list(calls), observations)
        return observations


class AskConfig(AgentConfig):
    """One question answered live: `searchrl ask QUESTION [--config FILE] [flags]`. Generation as in
    evaluation: greedy, k=5, at most 8 searches and 512 policy tokens; greedy=false (--sample)
    samples with temperature and top_p, seeded by seed (--seed). It searches the toy world's index
    unless told otherwise."""

    defaults = AgentDefaults(
        rollout=EVAL_ROLLOUT, retrieval={"index": "toyworld"},
        searches="ask searches: give an index (e.g. --index toyworld), a retriever URL "
        "(e.g. --retriever-url http://127.0.0.1:8000) or --web PROVIDER",
    )


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
    from searchrl.rollout.bounds import check_rollout_fits

    if not question.strip():
        raise SearchRLError('ask: the question is empty; give the question to answer, e.g. searchrl ask "Which river '
                            'flows through the capital?"')
    cfg = cfg or AskConfig()
    agent = build_agent(cfg, backend)
    q = Question("ask", question, ())
    try:
        # The bound `eval run` checks (rollout.bounds): a budget past the model's context is refused, not run into it.
        check_rollout_fits(cfg.rollout, agent.protocol, agent.backend.tokenizer, agent.backend.max_context, [q],
                           agent.retriever, cfg.retrieval.index)
    except BaseException:
        agent.close()
        raise
    announce(cfg)  # once the retriever and model are up: a config they refuse prints its error alone
    try:
        if as_json:
            traj = agent.engine.run([q])[0]
            print(json.dumps(traj.to_dict(), ensure_ascii=False))
            return traj
        view = _LiveView(console, agent.protocol)
        view.header(question, cfg.model, cfg.retrieval.source, sample=not cfg.rollout.greedy)
        shown = build_agent(cfg, StreamingBackend(agent.backend, view.text, chunk), agent.retriever, protocol=agent.protocol)
        agent.owned.append(shown)
        shown.engine.tools = {name: AnnouncingTool(tool, view.calls) for name, tool in shown.engine.tools.items()}
        started = time.perf_counter()
        traj = shown.engine.run([q])[0]
        view.finish(traj, time.perf_counter() - started, agent.retriever.usage())
        return traj
    finally:
        agent.close()


def ask_command(question: str, config: str | None, flags: dict, as_json: bool = False) -> Trajectory:
    """`searchrl ask`: YAML file, then the explicit flags (keyed by their config keys) win; a
    checkpoint's or an export's own protocol fills what they leave unset (`searchrl.profiles`)."""
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
        self.n_calls = 0

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

    def calls(self, name: str, arguments: list[dict], observations: list[Observation]) -> None:
        """One batch of calls of tool `name`: each call's arguments in a panel, then what it
        returned: a search's passages by title, any other observation's first lines."""
        from rich.panel import Panel
        from rich.text import Text

        for args, obs in zip(arguments, observations):
            self.n_calls += 1
            shown = args["query"] if name == "search" and isinstance(args.get("query"), str) else json.dumps(args, ensure_ascii=False)
            self.console.print()
            self.console.print(Panel(Text(visible(shown), style="bold yellow"), title=f"{name} {self.n_calls}",
                                     border_style="yellow" if obs.ok else "red", expand=False))
            found = Text()
            for i, p in enumerate(obs.passages if name == "search" else [], start=1):
                found.append(f"  {i}. ", style="bold")
                found.append(visible(p.title, keep_newlines=False))
                found.append(f"  [{visible(p.id, keep_newlines=False)}]\n", style="dim")
            if name != "search" or not obs.ok:
                lines = obs.text.splitlines()
                found.append("".join(f"  {visible(line, keep_newlines=False)}\n" for line in lines[:OBSERVATION_LINES]),
                             style="dim" if obs.ok else "red")
                if len(lines) > OBSERVATION_LINES:
                    found.append(f"  … {len(lines) - OBSERVATION_LINES} more lines\n", style="dim")
            self.console.print(found if found.plain else Text("  (no documents found)\n", style="dim"), end="")

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
        others = len(traj.tool_calls) - traj.n_searches
        if others:
            searches += f" · {others} other call" + ("" if others == 1 else "s")
        web = ""
        if spent is not None:  # web search: what this question cost
            web = f" · web: {spent['requests']} requests, {spent['cache_hits']} from cache, ${spent['cost_usd']:.3f}"
        self.console.print(f"{searches} · {sum(traj.loss_mask)} tokens generated · {seconds:.1f}s{web}", style="dim", highlight=False)
