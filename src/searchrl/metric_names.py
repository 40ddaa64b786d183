"""The names of a training step's metrics: one schema that the trainer (`rl.step`, `rl.sft`), the
health monitors (`rl.health`), the console line and TensorBoard (`runlog`), the plots
(`eval.plots`, `searchrl plot`) and the demo read, and the reference page `docs/reference/metrics.md`
is generated from (`searchrl.docs_reference`).

Each metric is a `Metric`: a name, its kind and a one-line meaning. A *family* is a name with one
`<slot>` (`reward/<term>`, `tools/<name>/calls`): `key(value)` spells one member, `matches(key)`
says whether a record key belongs to it. The constants below are the names; code writes and reads
`metric_names.SEARCH_RATE`, never the string, so a renamed metric cannot leave a reader behind.

A leaf module (standard library only): every part of the package may import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What each kind groups, in the order the reference page lists them.
KINDS = {
    "index": "Where the record sits in the run.",
    "reward": "The outcome reward of the step's rollouts (mean over rollouts).",
    "learning": "The policy update: losses, KL, entropy, ratio statistics, optimizer.",
    "rollout": "What the policy did in its rollouts (means over the step's rollouts).",
    "behaviour": ("How the agent fails where an outcome reward cannot tell it from reading "
                  "([evaluation guide](../guides/evaluation.md#failure-modes)); evaluation's metrics.json has the same keys."),
    "format": "The format check of the rewards: who passes it and which rule fails.",
    "retrieval": "Searches the step made.",
    "multihop": ("Multi-hop behaviour per question type ([evaluation guide](../guides/evaluation.md#multi-hop-behaviour)): `<type>` is each "
                 "type among the step's questions (the toy world's bridge-2hop, bridge-3hop, comparison, bridge-comparison, "
                 "inference; HotpotQA's bridge, comparison), `all` every rollout. Evaluation's metrics.json has the same keys."),
    "tools": "Tool calls (tag protocols count their one search tool too).",
    "web": "Web search spending (only with `retrieval.web`).",
    "health": "The health monitors' values after the step (`health.*` in the training config).",
    "timing": "Time and caching: these differ between identical runs (a resumed run starts with an empty cache).",
}


@dataclass(frozen=True)
class Metric:
    """One metric, or a family of them when `name` holds a `<slot>`."""

    name: str
    kind: str
    meaning: str

    @property
    def slot(self) -> str | None:
        found = re.search(r"<(\w+)>", self.name)
        return found[1] if found else None

    def key(self, value: str) -> str:
        """The member of a family: `Metric("reward/<term>", ...).key("format") == "reward/format"`."""
        if self.slot is None:
            raise ValueError(f"metric {self.name} is not a family")
        return self.name.replace(f"<{self.slot}>", value)

    def matches(self, key: str) -> bool:
        if self.slot is None:
            return key == self.name
        before, after = self.name.split(f"<{self.slot}>")
        return key.startswith(before) and key.endswith(after) and len(key) > len(before) + len(after)


SCHEMA: dict[str, Metric] = {}


def _metric(name: str, kind: str, meaning: str) -> str:
    assert name not in SCHEMA and kind in KINDS, name
    SCHEMA[name] = Metric(name, kind, meaning)
    return name


def _family(name: str, kind: str, meaning: str) -> Metric:
    _metric(name, kind, meaning)
    return SCHEMA[name]


# --- index
STAGE = _metric("stage", "index", "Training stage of the step: 1 (learn to search) or 2 (learn to use the results).")
STEP = _metric("step", "index", "Step of the run, from 1, counted over both stages.")
STAGE_STEP = _metric("stage_step", "index", "Step within its stage, from 1.")

# --- reward (rl stages)
REWARD = _metric("reward", "reward", "Mean total reward: the stage's weighted terms summed.")
REWARD_RETRIEVE = _metric("reward_retrieve", "reward", "Mean weighted retrieve term (Stage 1's reward for searching; 0 where its weight is 0).")
REWARD_FORMAT = _metric("reward_format", "reward", "Mean weighted format term: the stage's bonus for passing the format check or its penalty for failing.")
REWARD_ANSWER = _metric("reward_answer", "reward", "Mean weighted answer term (Stage 2's answer score against the gold answers; 0 where its weight is 0).")
REWARD_STD = _metric("reward_std", "reward", "Standard deviation of the total reward over the step's rollouts.")
REWARD_TERM = _family("reward/<term>", "reward", "Mean of one reward term of the stage as weighted into the total.")

# --- learning
PG_LOSS = _metric("pg_loss", "learning", "Clipped policy-gradient loss as minimised, mean over the optimizer steps.")
KL_LOSS = _metric("kl_loss", "learning", "The k3 KL loss term (0 unless algorithm.kl_kind is k3-loss).")
SFT_LOSS = _metric("sft_loss", "learning", "SFT stages only: masked NLL per policy token, mean over the optimizer steps.")
KL = _metric("kl", "learning", "k3 KL of the policy to the reference per policy token (null without a reference model).")
ENTROPY = _metric("entropy", "learning", "Policy entropy per policy token, in nats (null when no log-prob pass ran).")
LOGPROB_MISMATCH = _metric("logprob_mismatch", "learning",
                           "Mean |sampler log-prob − actor log-prob| per policy token: how far generation and training disagree.")
IS_RATIO_MEAN = _metric("is_ratio_mean", "learning",
                        "Mean importance ratio π_old / π_sampler per policy token: the trainer's policy at the start of the "
                        "update over the sampler's (behaviour) log-probs (algorithm.off_policy corrects for it; measured always).")
IS_RATIO_MAX = _metric("is_ratio_max", "learning", "Largest importance ratio π_old / π_sampler of any policy token of the step.")
IS_CLIP_FRAC = _metric("is_clip_frac", "learning",
                       "Share of policy tokens whose ratio π_old / π_sampler is over algorithm.is_cap (tis truncates them, decoupled leaves them out).")
STALENESS_MEAN = _metric("staleness_mean", "learning",
                         "Policy versions between the weights that sampled a rollout and those its update starts from, mean over rollouts (0 in sync mode).")
STALENESS_MAX = _metric("staleness_max", "learning", "The step's largest staleness (policy versions) of any rollout.")
CLIP_FRAC = _metric("clip_frac", "learning", "Share of policy tokens whose clipped branch won (they get no gradient).")
APPROX_KL = _metric("approx_kl", "learning", "k3 estimate of KL(old ‖ new) over the updates, per policy token.")
RATIO_MEAN = _metric("ratio_mean", "learning", "Mean importance ratio new / old over the policy tokens trained on.")
GRAD_NORM = _metric("grad_norm", "learning", "Global gradient norm before clipping, mean over the optimizer steps.")
UPDATES = _metric("updates", "learning", "Optimizer steps taken (0 when every group's rewards were equal).")
LR = _metric("lr", "learning", "Learning rate of the step's last update.")

# --- rollout
ROLLOUTS = _metric("rollouts", "rollout", "Rollouts in the step, over every process.")
DROPPED_GROUPS = _metric("dropped_groups", "rollout",
                         "Async mode only: question groups dropped on arrival as older than rollout.max_staleness (and generated again); "
                         "admission control keeps this 0.")
SEARCH_RATE = _metric("search_rate", "rollout", "Share of rollouts that searched at least once.")
SEARCHES = _metric("searches", "rollout", "Searches per rollout.")
TRUNCATED_DOCUMENTS = _metric("truncated_documents", "rollout", "Retrieved-document blocks cut to fit the context, per rollout.")
ANSWER_F1 = _metric("answer_f1", "rollout", "Mean token F1 of the answers against the gold answers (no answer scores 0).")
ANSWER_RATE = _metric("answer_rate", "rollout", "Share of rollouts that gave an answer.")
ECHO_RATE = _metric("echo_rate", "rollout",
                    "Share of comparison-like answers that name both candidates or the gold plus another (null: none comparison-like).")
FLAT_GROUPS = _metric("flat_groups", "rollout", "Share of question groups whose rewards are all equal: no learning signal.")
# --- behaviour (eval.behaviour)
QUERY_ECHO_RATE = _metric("query_echo_rate", "behaviour",
                          "Share of rollouts whose answer is, after normalisation, their only query: a guess searched and "
                          "answered whatever the search returned.")
UNGROUNDED_RATE = _metric("ungrounded_rate", "behaviour",
                          "Share of answers that stand in no document the rollout was shown (null: no answer other than yes/no).")
OVERHOP_RATE = _metric("overhop_rate", "behaviour",
                       "Share of rollouts that searched again after a gold answer stood in the documents they had read "
                       "(null: every gold answer is yes/no).")
AVOID_RATE = _metric("avoid_rate", "behaviour", "Share of rollouts with no answer or an empty one.")
EMPTY_SEARCH_RATE = _metric("empty_search_rate", "behaviour", "Share of searches that returned no passage (null: no search).")
REFILL_ROUNDS = _metric("refill_rounds", "rollout",
                        "stage.refill_flat_groups only: rounds of other questions drawn to replace groups without signal.")
FLAT_DROPPED = _metric("flat_dropped", "rollout",
                       "stage.refill_flat_groups only: question groups left out of the update for their equal rewards.")
THINK_REPEAT_RATE = _metric("think_repeat_rate", "rollout",
                            "Share of the word 4-grams of a rollout's think text that repeat an earlier one of the same text, mean "
                            "over rollouts (null: no rollout wrote 4 words of reasoning). Healthy reasoning repeats its entities' "
                            "names (the R1-Searcher authors' Qwen-7B rollouts: 0.29); a looping one tends to 1.")
THINK_LOOP_RATE = _metric("think_loop_rate", "rollout",
                          "Share of rollouts whose think text writes one span of up to 32 words three or more times back to back "
                          "(null: no rollout wrote reasoning): the reasoning degenerating into a loop.")
RESPONSE_TOKENS = _metric("response_tokens", "rollout", "Policy tokens per rollout (what the loss trains on).")
ENV_TOKENS = _metric("env_tokens", "rollout", "Environment tokens per rollout: retrieved documents and tool results (loss mask 0).")
STOP = _family("stop_<reason>", "rollout", "Share of rollouts that ended for this reason.")

# --- format
FORMAT_OK = _metric("format_ok", "format", "Share of rollouts that pass the format check.")
MALFORMED_TAGS = _metric("malformed_tags", "format",
                         "Share of rollouts failing a rule about the protocol's tags or calls (think, answer, query, forged_documents, "
                         "answer_tags, calls): format_ok's failures less those of the text rules (garbled, script, answer_length).")
FORMAT_FAILED = _family("format_failed_<rule>", "format", "Share of rollouts failing this rule of the format check.")

# --- retrieval
RETRIEVAL_QUERIES = _metric("retrieval_queries", "retrieval", "Queries searched in the step, over every process.")

# --- multihop (written by `searchrl.eval.multihop`)
MULTIHOP_ROLLOUTS = _family("multihop/<type>/rollouts", "multihop", "Rollouts of the type's questions.")
MULTIHOP_SEARCHES = _family("multihop/<type>/searches", "multihop", "Served searches per rollout of the type.")
MULTIHOP_BRIDGE_RATE = _family("multihop/<type>/bridge_rate", "multihop",
                               "Share of the type's rollouts with a bridge step: a later query names an entity that only an "
                               "earlier search's passages gave (neither the question nor an earlier query).")
MULTIHOP_SUPPORT_HOP1 = _family("multihop/<type>/support_hop1", "multihop",
                                "Supporting passages first retrieved by the first search, per rollout "
                                "(null: the type's questions name no supporting passages).")
MULTIHOP_SUPPORT_HOP2 = _family("multihop/<type>/support_hop2", "multihop",
                                "Supporting passages first retrieved by the second search, per rollout (null as above).")
MULTIHOP_SUPPORT_HOP3 = _family("multihop/<type>/support_hop3", "multihop",
                                "Supporting passages first retrieved by the third or a later search, per rollout (null as above).")
MULTIHOP_EM = _family("multihop/<type>/em", "multihop", "Answer exact match of the type's rollouts (no answer scores 0).")
MULTIHOP_F1 = _family("multihop/<type>/f1", "multihop", "Answer token F1 of the type's rollouts (no answer scores 0).")

# --- tools (written by `searchrl.tools.metrics`)
TOOL_CALLS = _family("tools/<name>/calls", "tools", "Calls of the tool per rollout, served or refused.")
TOOL_LATENCY = _family("tools/<name>/latency_s", "timing", "Wall seconds per call of the tool that ran (null when none ran).")
TOOLS_INVALID_RATE = _metric("tools/invalid_rate", "tools",
                             "Share of call attempts that were the policy's mistakes: malformed, an unknown tool, bad arguments.")
TOOLS_REFUSED_RATE = _metric("tools/refused_rate", "tools", "Share of call attempts refused for being over a budget.")

# --- web
WEB = _family("web_<counter>", "web", "The counter's increase over the step: requests, cache hits, pages, page failures, dollars.")
WEB_COST_USD_TOTAL = _metric("web_cost_usd_total", "web", "Dollars the run's web searches have cost so far.")

# --- health
HEALTH = _family("health_<monitor>", "health", "The monitor's value after the step (null when it has nothing to judge yet).")

# --- timing
STEP_SECONDS = _metric("step_seconds", "timing", "Wall seconds of the whole step (the slowest process's).")
ROLLOUT_SECONDS = _metric("rollout_seconds", "timing", "Wall seconds generating the rollouts, searches included.")
LOGPROB_SECONDS = _metric("logprob_seconds", "timing", "Wall seconds scoring rollouts and computing reference and old log-probs.")
UPDATE_SECONDS = _metric("update_seconds", "timing", "Wall seconds of the policy updates and the weight sync to the generator.")
BUILD_SECONDS = _metric("build_seconds", "timing", "SFT stages only: wall seconds writing the gold trajectories.")
BUFFER_DEPTH = _metric("buffer_depth", "timing",
                       "Async mode only: batches generated ahead and waiting in the buffer when the step took its own.")
TRAINER_IDLE_SHARE = _metric("trainer_idle_share", "timing",
                             "Async mode only: share of the step the trainer waited for its batch (0: generation kept ahead of training).")
GENERATION_IDLE_SHARE = _metric("generation_idle_share", "timing",
                                "Async mode only: share of the step the rollout workers waited with no order to generate "
                                "(averaged over the workers; 0: generation never waited for the trainer).")
TOKENS_PER_S = _metric("tokens_per_s", "timing", "Policy tokens generated per second of the rollout phase.")
RETRIEVAL_S = _metric("retrieval_s", "timing", "Wall seconds in search (the slowest process's; cache lookups included).")
RETRIEVAL_CACHE_HIT_RATE = _metric("retrieval_cache_hit_rate", "timing",
                                   "Share of queries answered without a search of their own (null: no searches or no cache).")

# The monitors whose value is made of times: it differs between identical runs as timing does.
TIMING_HEALTH = ("step_time", "trainer_idle", "rollout_wait")


def describe(key: str, schema: dict[str, Metric] = SCHEMA) -> Metric | None:
    """The entry of a record key in `schema` (a step's; evaluation's is `eval.result_names`): its
    own, else its family's; None when it has none."""
    if key in schema:
        return schema[key]
    return next((m for m in schema.values() if m.slot and m.matches(key)), None)


def is_timing(key: str) -> bool:
    """Whether a step record's `key` measures time or caching (kind timing, and the values of the
    monitors of times), which differs between identical runs."""
    found = describe(key)
    return (found is not None and found.kind == "timing") or key in {HEALTH.key(m) for m in TIMING_HEALTH}
