"""Dynamic sampling (`stage.refill_flat_groups`): groups whose rewards are all equal leave the
step's batch and other questions of the stage refill it, seeded by the step."""

from __future__ import annotations

import doctest

import pytest

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Question
from searchrl.protocols.tags import SEARCH_R1_TAGS
from searchrl.rewards import RewardConfig
from searchrl.rl import step
from searchrl.rl.config import StageConfig, TrainConfig
from searchrl.rl.step import StepIndex, collect_with_signal


def test_doctests():
    assert doctest.testmod(step).failed == 0


class Worker:
    """Answers every question's samples by a fixed plan: "flat-*" questions all right, "easy-*" and
    "pool-*" half right (signal); records what it was asked to collect."""

    protocol = SEARCH_R1_TAGS

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def collect(self, questions, n, seed, progress=False):
        self.calls.append(([q.id for q in questions], seed))
        out = []
        for q in questions:
            for i in range(n):
                right = q.id.startswith("flat") or i % 2 == 0
                text = "<search>x</search>"
                answer = q.answers[0] if right else "wrong"
                segs = [Segment(text, "policy"), Segment("\n\n<information>\n(1)Title: T Text: x\n</information>\n\n", "env"),
                        Segment(f"<answer>{answer}</answer>", "policy")]
                out.append(Trajectory(q.id, q.question, [], [], [], [], segs, queries=["x"], retrieved_ids=[["p"]],
                                      n_searches=1, answer=answer, stop_reason="answer"))
        return out


def _q(qid: str) -> Question:
    return Question(id=qid, question=f"Where is {qid}?", answers=[f"Town {qid}"])


def _stage(rounds: int) -> StageConfig:
    return StageConfig(reward=RewardConfig(stage="stage2", require_think=False), prompts_per_step=2,
                       samples_per_prompt=4, refill_flat_groups=rounds)


AT = StepIndex(stage=2, step=5, stage_step=0, seed=11)
POOL = [_q(f"pool-{i}") for i in range(6)]


def test_flat_groups_are_replaced_by_questions_of_the_pool_with_signal():
    worker = Worker()
    scored, drawn = collect_with_signal(worker, _stage(2), [_q("flat-a"), _q("easy-b")], AT, POOL, False)
    assert len(worker.calls) == 2 and len(worker.calls[1][0]) == 1  # one refill round, for the one flat group
    refill = worker.calls[1][0][0]
    assert refill.startswith("pool-") and worker.calls[1][1] != AT.seed  # another question, other samples
    assert {q.id for q in scored.questions} == {"easy-b", refill}
    assert scored.group_ids == [0] * 4 + [1] * 4  # renumbered, whole groups
    assert (drawn.groups, drawn.flat, drawn.dropped, drawn.rounds) == (3, 1, 1, 1)
    # the same step draws the same refill again (a resumed run repeats it)
    again = Worker()
    collect_with_signal(again, _stage(2), [_q("flat-a"), _q("easy-b")], AT, POOL, False)
    assert again.calls == worker.calls


def test_without_refill_every_group_stays_and_all_flat_keeps_the_first_draw():
    scored, drawn = collect_with_signal(Worker(), _stage(0), [_q("flat-a"), _q("easy-b")], AT, POOL, False)
    assert len(scored.trajectories) == 8 and (drawn.groups, drawn.flat, drawn.dropped, drawn.rounds) == (2, 1, 0, 0)
    flat_pool = [_q(f"flat-{i}") for i in range(3)]
    worker = Worker()
    scored, drawn = collect_with_signal(worker, _stage(5), [_q("flat-a"), _q("flat-b")], AT, flat_pool, False)
    assert len(worker.calls) == 3  # two rounds took the pool's last 3 questions (2, then 1); then it ran out
    assert [q.id for q in scored.questions[::4]] == ["flat-a", "flat-b"] and drawn.dropped == 0


def test_refill_needs_a_sync_rl_stage():
    with pytest.raises(ValueError, match="refill_flat_groups"):
        TrainConfig(model="tiny-random", retrieval={"index": "toyworld"}, stage2={"refill_flat_groups": 2},
                    rollout={"mode": "async"})


def test_a_training_run_refills_and_logs_what_it_drew(world, tmp_path):
    from test_trainer import _overrides

    from searchrl.config import load_config
    from searchrl.rl.trainer import train
    from searchrl.runlog import read_metrics

    cfg = load_config(TrainConfig, None, _overrides(world, tmp_path / "run", "stage1.enabled=false",
                                                     "stage2.refill_flat_groups=2"))
    [r] = read_metrics(train(cfg))
    # A random model never answers: every group is flat, both rounds drew others in vain, and the
    # step kept its first draw (whose update is skipped as any flat batch's).
    assert (r["refill_rounds"], r["flat_dropped"], r["flat_groups"], r["rollouts"], r["updates"]) == (2, 0, 1.0, 4, 0)
