"""The demo wiring on the tiny model, and the figures its report is judged by."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from searchrl.config import load_config
from searchrl.demo import DemoConfig, run_demo, stage_summary, verdict_markdown
from searchrl.errors import SearchRLError
from searchrl.rl.config import TrainConfig
from searchrl.runlog import read_metrics


def test_stage_summary_reads_first_last_and_quarters():
    records = [
        {"stage": 1, "search_rate": 0.25, "format_ok": 0.0, "answer_f1": 0.0},
        {"stage": 1, "search_rate": 1.0, "format_ok": 0.5, "answer_f1": 0.0},
        {"stage": 1, "search_rate": 0.9, "format_ok": 0.75, "answer_f1": 0.0},
    ] + [{"stage": 2, "search_rate": 1.0, "format_ok": 1.0, "answer_f1": f} for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)]
    s = stage_summary(records)
    assert s["stage1"] == {
        "steps": 3,
        "search_rate_first": 0.25,
        "search_rate_last": 0.9,
        "search_rate_max": 1.0,
        "format_ok_first": 0.0,
        "format_ok_last": 0.75,
    }
    # 8 Stage-2 steps: quarters of 2 -> (0.1 + 0.2) / 2 and (0.7 + 0.8) / 2
    assert s["stage2"]["steps"] == 8
    assert s["stage2"]["answer_f1_first_quarter"] == pytest.approx(0.15)
    assert s["stage2"]["answer_f1_last_quarter"] == pytest.approx(0.75)


def _predictions(folder, right):
    folder.mkdir()
    rows = [{"id": f"q{i}", "type": "bridge-2hop" if i % 2 else "comparison", "answers": ["Alba"],
             "prediction": "Alba" if ok else "Bram"} for i, ok in enumerate(right)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_verdict_says_which_side_the_paired_interval_is_on(tmp_path):
    rag = _predictions(tmp_path / "eval-untrained-rag", [False] * 30)
    ahead = _predictions(tmp_path / "eval-trained-agent", [True] * 30)
    text = "\n".join(verdict_markdown([rag, ahead]))
    assert "trained agent 100.0 [100.0, 100.0] %, untrained rag 0.0 [0.0, 0.0] %" in text
    assert "Difference: +100.0 points" in text and "The trained agent is ahead" in text
    assert "bridge-2hop (n=15) 100% vs 0%" in text
    # one question of 30 apart: the interval holds 0
    shutil.rmtree(ahead)
    close = _predictions(tmp_path / "eval-trained-agent", [True] + [False] * 29)
    text = "\n".join(verdict_markdown([rag, close]))
    assert "Difference: +3.3 points" in text and "30 questions cannot tell them apart" in text
    # no trained run (train=False): no verdict
    assert verdict_markdown([rag]) == []


def test_demo_without_training_serves_evaluates_and_reports(tmp_path):
    out = run_demo(DemoConfig(out=str(tmp_path / "demo"), eval_limit=2, eval_max_new_tokens=16, train=False), ["model=tiny-random"])
    train = load_config(TrainConfig, "demo-cpu", ["model=tiny-random"])
    for method in ("agent", "rag"):
        metrics = json.loads((out / f"eval-untrained-{method}" / "metrics.json").read_text())
        assert metrics["n"] == 2 and metrics["method"] == method
        # Every search went through the in-process HTTP server.
        assert metrics["retriever"].startswith("http://127.0.0.1:")
        # The evaluation speaks the training protocol and searches as training does, greedily within its budget.
        saved = yaml.safe_load((out / f"eval-untrained-{method}" / "config.yaml").read_text())
        assert saved["protocol"] == train.protocol.model_dump()
        assert saved["rollout"] == {**train.rollout.model_dump(), "greedy": True, "max_new_tokens": 16, "batch_size": 16}
        assert saved["retrieval"] == {**train.retrieval.model_dump(), "index": None, "url": metrics["retriever"]}
    report = (out / "report.md").read_text()
    assert "Before and after training" in report and "untrained" in report


def test_demo_trains_both_stages_then_reports_before_after_and_curves(tmp_path):
    tiny = ["model=tiny-random", "stage1.steps=1", "stage2.steps=1", "stage1.samples_per_prompt=2",
            "stage2.samples_per_prompt=2", "rollout.max_new_tokens=8", "logging.progress=false"]
    out = run_demo(DemoConfig(out=str(tmp_path / "demo"), eval_limit=1, eval_max_new_tokens=16), tiny)
    assert [r["stage"] for r in read_metrics(out / "train")] == [1, 2]
    for run in ("untrained-agent", "untrained-rag", "trained-agent"):
        assert json.loads((out / f"eval-{run}" / "metrics.json").read_text())["n"] == 1
    assert not (out / "eval-trained-rag").exists()  # the baseline is the untrained model's
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stage1"]["steps"] == 1 and summary["stage2"]["steps"] == 1
    report = (out / "report.md").read_text()
    assert "Stage 1 (learn to call search)" in report and "Stage 2 (learn to use the results)" in report
    assert "(plots/training_curves.png)" in report and (out / "plots" / "training_curves.png").is_file()
    # Every folder records its run; training names the index its temporary server served.
    for folder in (out, out / "train", out / "eval-trained-agent"):
        assert json.loads((folder / "run_info.json").read_text())["status"] == "finished", folder
        assert (folder / "console.log").is_file()
    searched = json.loads((out / "train" / "run_info.json").read_text())["retrieval"]
    assert searched["index"] == "toyworld" and searched["url"].startswith("http://127.0.0.1:")


def test_demo_never_overwrites_an_earlier_demo_and_resume_goes_on_from_it(tmp_path):
    tiny = ["model=tiny-random", "stage1.steps=1", "stage2.steps=1", "stage1.samples_per_prompt=2",
            "stage2.samples_per_prompt=2", "rollout.max_new_tokens=8", "logging.progress=false"]
    cfg = DemoConfig(out=str(tmp_path / "demo"), eval_limit=1, eval_max_new_tokens=16)
    out = run_demo(cfg, tiny)
    written = {p: p.read_bytes() for p in out.glob("eval-*/predictions.jsonl")}
    with pytest.raises(SearchRLError, match=r"already holds a demo \(eval-trained-agent, eval-untrained-agent, "
                                            r"eval-untrained-rag, train\): continue it with `searchrl demo --resume"):
        run_demo(cfg, tiny)
    # A stop after Stage 1's checkpoint and before the trained evaluation: resume trains Stage 2 only.
    ckpts = sorted((out / "train" / "checkpoints").iterdir())
    shutil.rmtree(ckpts[-1])
    shutil.rmtree(out / "eval-trained-agent")
    metrics = (out / "train" / "metrics.jsonl").read_text().splitlines()
    (out / "train" / "metrics.jsonl").write_text(metrics[0] + "\n")
    run_demo(cfg.model_copy(update={"resume": True}), tiny)
    assert [r["stage"] for r in read_metrics(out / "train")] == [1, 2]
    assert all(p.read_bytes() == before for p, before in written.items() if "untrained" in str(p))
    assert json.loads((out / "eval-trained-agent" / "metrics.json").read_text())["n"] == 1


def test_demo_runs_the_sft_recipe_with_gold_paths_from_the_local_index(tmp_path):
    # SFT reads its gold trajectories' passages from the index, which the demo's server cannot list
    tiny = ["model=tiny-random", "stage1.steps=1", "stage2.steps=1", "stage1.prompts_per_step=2",
            "stage2.prompts_per_step=2", "logging.progress=false"]  # gold paths need the 128 tokens
    cfg = DemoConfig(out=str(tmp_path / "sft"), train_config="sft-demo-cpu", eval_limit=1,
                     eval_max_new_tokens=16)
    out = run_demo(cfg, tiny)
    train_config = yaml.safe_load((out / "train" / "config.yaml").read_text())
    assert train_config["stage1"]["kind"] == "sft" and train_config["retrieval"]["index"] == "toyworld"
    assert [r["stage"] for r in read_metrics(out / "train")] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"seconds", "sft1", "sft2"} and summary["sft2"]["steps"] == 1
    assert "Stage 2 (supervised fine-tuning on gold trajectories)" in (out / "report.md").read_text()
    trained = yaml.safe_load((out / "eval-trained-agent" / "config.yaml").read_text())
    assert trained["retrieval"]["index"] is None and trained["retrieval"]["url"].startswith("http://127.0.0.1:")
