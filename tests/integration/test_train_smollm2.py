"""The shipped CPU demo config on the real SmolLM2-135M-Instruct and the toy world, shrunk to one
step per stage: both stages run, searches are served and trained on, plots come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchrl.config import load_config
from searchrl.eval.plots import plot_run
from searchrl.rl.config import TrainConfig
from searchrl.rl.trainer import train
from searchrl.runlog import read_metrics

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo-cpu.yaml"


@pytest.mark.integration
def test_demo_config_runs_both_stages_on_smollm2(tmp_path):
    cfg = load_config(TrainConfig, DEMO, [
        f"out={tmp_path / 'run'}", "stage1.steps=1", "stage2.steps=1",
        "stage1.prompts_per_step=1", "stage2.prompts_per_step=1",
        # 8 samples: the untrained model searches in ~1 of 5 one-shot rollouts (docs/concepts/protocols.md)
        "stage1.samples_per_prompt=8", "stage2.samples_per_prompt=8",
        "rollout.max_new_tokens=48", "logging.progress=false",
    ])
    run = train(cfg)
    records = read_metrics(run)
    assert [(r["stage"], r["step"]) for r in records] == [(1, 1), (2, 2)]
    for r in records:
        assert r["rollouts"] == 8 and 0 < r["response_tokens"] <= 48
        # The trainer recomputes exactly what the sampler computed (same weights, fp32 on CPU).
        if r["logprob_mismatch"] is not None:
            assert r["logprob_mismatch"] < 1e-3
    # The one-shot search-r1 prompt makes SmolLM2 search at least sometimes (docs/concepts/protocols.md).
    assert any(r["searches"] > 0 for r in records)
    assert (run / "checkpoints" / "step_0001" / "model.safetensors").is_file()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0002"
    assert len(plot_run(run)) == 6
