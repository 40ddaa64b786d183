"""Training with torchrun: 2 processes (gloo, CPU, FSDP2, the tiny model) against 1.

The runs go through `tests/dist_driver.py`, which generates every question on its own (seeded by
its id) so both runs sample the same rollouts, and adds a token-dependent term to the reward so
the random model has something to learn. Stage 1 gets 3 questions per step, so the ranks hold 1
and 2 groups: unequal micro-batch counts, evened out by idle passes. In async mode rank 0's
rollout worker process generates both ranks' shares (`rl.async_ranks`).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from searchrl import metric_names as mn
from searchrl.rl.async_ranks import AHEAD_FILE
from searchrl.rl.step import is_timing
from searchrl.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "dist_driver.py"
# Stated tolerances: float sums in another order (all-reduces, split micro-batches) and Adam
# amplifying last-bit gradient differences; the weights move ~4e-3 from their start.
METRIC_RTOL, ADVANTAGE_ATOL, PARAM_ATOL = 1e-5, 1e-5, 2e-5


def _args(world: Path) -> list[str]:
    return [
        "--config", str(ROOT / "configs" / "demo-cpu.yaml"),
        "model=tiny-random", f"retrieval.index={world / 'index'}", f"protocol.template={world / 'prompt.txt'}",
        f"stage1.dataset={world / 'q.jsonl'}", f"stage2.dataset={world / 'q.jsonl'}", "stage2.question_types=null",
        "stage1.steps=2", "stage2.steps=1", "stage1.prompts_per_step=3", "stage2.prompts_per_step=2",
        "stage1.samples_per_prompt=2", "stage2.samples_per_prompt=2",
        "rollout.max_new_tokens=10", "rollout.top_p=1.0",
        "algorithm.lr=1e-3", "algorithm.kl_coef=0.05", "algorithm.ppo_epochs=2", "algorithm.micro_batch_size=2",
        "algorithm.gradient_checkpointing=true",
        "logging.checkpoint_every=1", "logging.keep_last=null", "logging.progress=false", "logging.report_to=[]",
    ]


def _command(nproc: int, *args: str) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc else [sys.executable]
    return [*launcher, str(DRIVER), "train", *args]


def _run(nproc: int, dump: Path, *args: str, fails: bool = False) -> None:
    dump.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(_command(nproc, *args), env={**os.environ, "DUMP_DIR": str(dump)}, capture_output=True, text=True, timeout=600)
    assert (done.returncode != 0) == fails, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def one_process(world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one")
    _run(0, out, *_args(world), "--out", str(out / "run"))
    return out


@pytest.fixture(scope="module")
def two_processes(world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two")
    _run(2, out, *_args(world), "--out", str(out / "run"))
    return out


def _learning(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in records]


def _close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=METRIC_RTOL, abs_tol=1e-7)
    return a == b


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "run" / "checkpoints" / "step_0003" / "model.safetensors")


def test_two_processes_equal_one_on_the_same_global_batch(one_process, two_processes):
    one, two = read_metrics(one_process / "run"), read_metrics(two_processes / "run")
    assert [r["step"] for r in two] == [1, 2, 3] and [r["rollouts"] for r in two] == [6, 6, 4]
    for a, b in zip(_learning(one), _learning(two)):
        assert a.keys() == b.keys()
        assert all(_close(a[k], b[k]) for k in a), {k: (a[k], b[k]) for k in a if not _close(a[k], b[k])}
    assert any(r["updates"] == 2 and r["pg_loss"] != 0 for r in one)  # the steps trained

    # Advantages: the 2 ranks' rows, in rank order, are the 1-process batch.
    single = torch.load(one_process / "advantages_rank0.pt")
    ranks = [torch.load(two_processes / f"advantages_rank{r}.pt") for r in (0, 1)]
    for step, whole in enumerate(single):
        parts = [r[step] for r in ranks]
        width = max(t.shape[1] for t in [whole, *parts])
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        assert torch.allclose(pad(whole), torch.cat([pad(p) for p in parts]), atol=ADVANTAGE_ATOL)
        assert [len(p) for p in parts] == ([2, 4] if step < 2 else [2, 2])

    # Parameters after the run: the stage-end export of the sharded run equals save_pretrained.
    w1, w2 = _final_weights(one_process), _final_weights(two_processes)
    from searchrl.assets import resolve_model

    start = load_file(Path(resolve_model("tiny-random")) / "model.safetensors")
    assert set(w2) <= set(w1)
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w2) < PARAM_ATOL
    assert max(float((w1[k] - start[k]).abs().max()) for k in start) > 100 * PARAM_ATOL  # they did move


def test_a_killed_two_process_run_resumes_to_the_uninterrupted_end_state(world, two_processes, tmp_path):
    run = tmp_path / "run"
    args = [*_args(world), "--out", str(run)]
    proc = subprocess.Popen(_command(2, *args), env={**os.environ, "DUMP_DIR": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = run / "checkpoints" / "step_0001" / "trainer_state.json"
    deadline = time.monotonic() + 300
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, mid-run
    proc.wait()
    assert first.exists() and not (run / "checkpoints" / "step_0003").exists(), "the kill came too late to test a resume"

    _run(2, tmp_path, "--resume", str(run))
    assert _learning(read_metrics(run)) == _learning(read_metrics(two_processes / "run"))
    w_resumed, w_whole = load_file(run / "checkpoints" / "step_0003" / "model.safetensors"), _final_weights(two_processes)
    assert all(torch.equal(w_resumed[k], w_whole[k]) for k in w_whole)


def test_torchrun_command_logs_the_global_batch_and_exports_a_model_eval_loads(tmp_path):
    """The issue's command, as users type it: one metrics.jsonl with the steps and global batch of a
    1-process run (prompts_per_step x samples_per_prompt of each stage; the equality test above
    compares the values themselves), and a final checkpoint `eval run --model` loads."""
    out = tmp_path / "np2"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "searchrl",
                           "train", "--config", str(ROOT / "configs" / "demo-cpu.yaml"), "model=tiny-random", "stage1.steps=2",
                           "stage2.steps=2", "logging.progress=false", "logging.report_to=[]", "rollout.max_new_tokens=24",
                           f"out={out}"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # demo-cpu.yaml: Stage 1 = 2 questions x 8 samples, Stage 2 = 2 x 8 (one question per rank)
    assert [(r["step"], r["stage"], r["rollouts"]) for r in read_metrics(out)] == [(1, 1, 16), (2, 1, 16), (3, 2, 16), (4, 2, 16)]
    assert (out / "metrics.jsonl").read_text().count("\n") == 4  # rank 0 alone wrote it

    final = tmp_path / "np2" / "checkpoints" / "step_0004"
    done = subprocess.run([sys.executable, "-m", "searchrl", "eval", "run", "--model", str(final), "--limit", "2", "--index", "toyworld",
                           "--out", str(tmp_path / "eval"), "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len((tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()) == 2


# -- asynchronous rollouts (rollout.mode=async) on 2 ranks: rank 0's worker process, shares scattered

PIPELINE = (mn.BUFFER_DEPTH, mn.DROPPED_GROUPS, mn.TRAINER_IDLE_SHARE)


def _async_run(world: Path, out: Path, staleness: int, *extra: str, fails: bool = False) -> None:
    _run(2, out, *_args(world), "rollout.mode=async", f"rollout.max_staleness={staleness}", *extra,
                "--out", str(out / "run"), fails=fails)


def _without_pipeline(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in PIPELINE} for r in _learning(records)]


def _assert_records_close(a: list[dict], b: list[dict], tol: float) -> None:
    assert len(a) == len(b) and [r.keys() for r in a] == [r.keys() for r in b]
    for ra, rb in zip(a, b):
        far = {k: (v, rb[k]) for k, v in ra.items() if (abs(v - rb[k]) > tol if isinstance(v, float) else v != rb[k])}
        assert not far, (ra["step"], far)


def test_two_rank_async_at_staleness_0_equals_the_two_rank_sync_run(world, two_processes, tmp_path):
    _async_run(world, tmp_path, 0)
    sync, run = read_metrics(two_processes / "run"), read_metrics(tmp_path / "run")
    _assert_records_close(_without_pipeline(sync), _without_pipeline(run), 1e-6)
    assert [r["rollouts"] for r in run] == [6, 6, 4] and any(r["pg_loss"] != 0 for r in run)
    assert all(r[mn.STALENESS_MAX] == 0 and r[mn.DROPPED_GROUPS] == 0 for r in run)
    assert all(0 <= r[mn.TRAINER_IDLE_SHARE] <= 1 and r[mn.BUFFER_DEPTH] == 0 for r in run)  # lockstep: nothing ahead
    # each rank trained on its own share: rank 1's advantages are those of the sync run's rank 1
    for rank in (0, 1):
        for a, b in zip(torch.load(two_processes / f"advantages_rank{rank}.pt"), torch.load(tmp_path / f"advantages_rank{rank}.pt")):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6)
    w_sync, w_async = _final_weights(two_processes), _final_weights(tmp_path)
    assert max(float((w_sync[k] - w_async[k]).abs().max()) for k in w_sync) <= 1e-6


def test_two_rank_async_at_staleness_1_overlaps_and_resumes_to_the_uninterrupted_end(world, tmp_path):
    full = tmp_path / "full"
    _async_run(world, full, 1)
    records = read_metrics(full / "run")
    assert [r[mn.STALENESS_MAX] for r in records] == [0, 1, 0]  # each stage's first batch: its start weights
    assert [r["rollouts"] for r in records] == [6, 6, 4] and all(r[mn.DROPPED_GROUPS] == 0 for r in records)

    crashed = tmp_path / "crashed"
    _async_run(world, crashed, 1, "debug_crash_after_step=2", fails=True)  # logged step 2, saved step 1
    assert len(read_metrics(crashed / "run")) == 2
    first = crashed / "run" / "checkpoints" / "step_0001"
    assert [p.name for p in sorted(first.parent.glob("step_*"))] == ["step_0001"] and (first / AHEAD_FILE).is_file()
    _run(2, crashed, "--resume", str(crashed / "run"), "debug_crash_after_step=null")  # step 2's batch: from the checkpoint
    _assert_records_close(_without_pipeline(records), _without_pipeline(read_metrics(crashed / "run")), 1e-6)
    w_full, w_resumed = _final_weights(full), _final_weights(crashed)
    assert max(float((w_full[k] - w_resumed[k]).abs().max()) for k in w_full) <= 1e-6
