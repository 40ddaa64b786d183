"""The rollout worker: a step's trajectories from the rollout engine over a generation backend
chosen by name (`rollout.backend`). It never sees an optimizer; after every update the trainer
hands it the policy's new weights and their version (`sync_weights`).

- `hf`: the backend runs the actor's own model object, so the weights are always current and
  syncing is a no-op; with a sharded actor (torchrun) it holds a whole copy of its own, in the
  compute dtype, into which each update is gathered (a sharded forward would need every rank).
- `vllm`: an engine of its own, colocated on the actor's device; weights are pushed into it after
  each update, and `sleep` / `wake` free its KV-cache memory while the actor trains (GPU).

Every trajectory it returns carries the policy version of the weights that sampled it
(`Trajectory.policy_version`): the actor's update count when the worker last received them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from searchrl import metric_names as mn
from searchrl.data.trajectory import Trajectory
from searchrl.data.types import Question
from searchrl.protocols.base import Protocol
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.querycache import CachedRetriever, RetrievalCounts
from searchrl.retrieval.web.budget import COUNTERS
from searchrl.rollout.agent import Agent, build_agent, load_backend


class RolloutWorker:
    def __init__(self, agent: Agent, precision, version: int = 0) -> None:
        self.engine = agent.engine
        self.version = version  # the policy version of the weights the backend holds
        self.cfg = agent.engine.cfg
        self.precision = precision  # context manager factory around decoding (`precision.rollout_autocast`)
        self._spent = agent.retriever.usage()
        self._searched = agent.retriever.counts()

    @classmethod
    def create(cls, actor, retriever: Retriever, protocol: Protocol) -> RolloutWorker:
        """The agent of the run over the backend `actor.cfg.rollout.backend` names, holding the
        current weights of `actor` (the trainer's policy: its `cfg`, `model`, `tokenizer`,
        `version` and whether `dist.sharded`), and `retriever` (opened by the preflight checks,
        `RunSearch.open`)."""
        from searchrl.rollout.precision import compute_dtype, rollout_autocast

        cfg = actor.cfg
        if cfg.rollout.backend == "hf" and not actor.dist.sharded:
            from searchrl.rollout.hf_backend import HFBackend

            backend = HFBackend(actor.model, actor.tokenizer)
        elif cfg.rollout.backend == "hf":  # a sharded model would need every rank in each forward
            from searchrl.assets import load_model
            from searchrl.rollout.hf_backend import HFBackend

            backend = HFBackend(*load_model(cfg.model, device=cfg.device, dtype=compute_dtype(cfg.dtype, cfg.device)))
            backend.sync_weights(actor.model)
        else:
            backend = load_backend(cfg)
            backend.sync_weights(actor.model)  # a resumed or LoRA actor differs from cfg.model
        # Counted always: a retriever opened by `RetrievalConfig` already is, any other gets a counter.
        retriever = retriever if isinstance(retriever, CachedRetriever) else CachedRetriever(retriever)
        precision = functools.partial(rollout_autocast, cfg.rollout.backend, cfg.dtype, cfg.device)
        return cls(build_agent(cfg, backend, retriever, protocol=protocol), precision, actor.version)

    @property
    def protocol(self) -> Protocol:
        return self.engine.protocol

    @property
    def tools(self) -> list[str]:
        """The names of the tools the rollouts may call."""
        return list(self.engine.tools)

    def begin(self, plan) -> None:
        """Nothing to plan: this worker generates each batch when it is collected (the
        asynchronous one, `rollout.async_worker`, starts the plan's batches ahead)."""

    def pipeline(self, step_seconds: float) -> dict:
        """No pipeline metrics: generation and training take turns."""
        return {}

    def collect(self, questions: list[Question], n: int, seed: int, progress: bool = False,
                between_rounds: Callable[[], int] | None = None) -> list[Trajectory]:
        """`n` rollouts per question, question-major, sampled with `seed`, each stamped with the
        policy version of the worker's weights. `between_rounds`: partial rollouts, whose weights
        may change between rounds (`RolloutEngine.run`); the engine stamps their versions."""
        self.engine.cfg = self.cfg.model_copy(update={"seed": seed, "samples_per_question": n})
        with self.precision():
            trajectories = self.engine.run(questions, n=n, progress=progress, between_rounds=between_rounds)
        if between_rounds is None:
            for t in trajectories:
                t.policy_version = self.version
        return trajectories

    def spent(self) -> dict[str, float]:
        """What the run's searches cost since the last call, as step metrics (`web_requests`,
        `web_cache_hits`, `web_cost_usd`, ... and `web_cost_usd_total`); web search counts over
        every process of the run, so rank 0's numbers are the run's. {} when searches are free."""
        now = self.engine.retriever.usage()
        if now is None:
            return {}
        before, self._spent = self._spent, now
        return {**{mn.WEB.key(c): round(now[c] - before[c], 6) for c in COUNTERS}, mn.WEB_COST_USD_TOTAL: now["cost_usd"]}

    def searched(self) -> RetrievalCounts:
        """This process's queries, cache hits and seconds in search since the last call."""
        now = self.engine.retriever.counts()
        before, self._searched = self._searched, now
        return now.since(before)

    def sync_weights(self, model, version: int) -> None:
        """The trainer's weights after update `version`."""
        self.engine.backend.sync_weights(model)
        self.version = version

    def sleep(self) -> None:
        self.engine.backend.sleep()

    def wake(self) -> None:
        self.engine.backend.wake()

    def close(self) -> None:
        """Free the backend (a vLLM engine and its KV cache; the actor keeps its model)."""
        self.engine.backend.close()

