"""Training with torchrun: 2 processes (gloo, CPU, FSDP2, the tiny model) against 1.

The runs go through `tests/dist_driver.py`, which generates every question on its own (seeded by
its id) so both runs sample the same rollouts, and adds a token-dependent term to the reward so
the random model has something to learn. Stage 1 gets 3 questions per step, so the ranks hold 1
and 2 groups: unequal micro-batch counts, evened out by idle passes.
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


def _run(nproc: int, dump: Path, *args: str) -> None:
    dump.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(_command(nproc, *args), env={**os.environ, "DUMP_DIR": str(dump)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


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
