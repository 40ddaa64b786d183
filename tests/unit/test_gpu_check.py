"""scripts/gpu_check.sh --dry end to end (CPU, tiny-random, a handful of tokens), so the GPU check
cannot rot between GPU runs: every part runs (prepare, rollout with forced search rounds, one RL
step under torchrun with FSDP2 on one gloo rank, two asynchronous RL steps with a rollout worker
process, the weights as a file then by broadcast, report) and the JSON holds every figure, sane."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("engine_vs_generate", "engine_tok_s", "generate_tok_s", "rl_step_seconds", "rl_peak_gb", "rollout_peak_gb",
           "async_step_seconds", "async_staleness_mean")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_gpu_check_dry(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"gpu_check: wrote {out}" in proc.stdout
    report = json.loads(out.read_text())
    assert report["mode"] == "dry" and report["device"] == "cpu" and report["gpu"]
    for key in ("torch", "transformers", "date", "python"):
        assert isinstance(report[key], str) and report[key], key
    assert all(_positive(report["figures"][k]) for k in FIGURES), report["figures"]
    ro, tr = report["rollout"], report["train"]
    # The engine really ran search rounds: queries served, documents read, tokens sampled.
    assert ro["searches"] > 0 and ro["document_tokens"] > 0 and ro["sampled_tokens"] > 0
    assert ro["engine_vs_generate"] == report["figures"]["engine_vs_generate"]
    # One RL step, with an optimizer update (its time would otherwise leave the update out).
    assert len(tr["steps"]) == 1 and tr["steps"][0]["updates"] >= 1 and tr["processes"] == 1
    assert all(_positive(tr["steps"][0][k]) for k in ("step_seconds", "rollout_seconds", "update_seconds"))
    # Two async steps, each with an update: the first on the stage's start weights, the second
    # generated ahead by them while the first trained, so one version stale.
    asy = report["async"]
    assert [r["staleness_max"] for r in asy["steps"]] == [0, 1] and all(r["updates"] >= 1 for r in asy["steps"])
    assert asy["staleness_mean"] == report["figures"]["async_staleness_mean"] == 0.5
    assert asy["step_seconds"] == asy["steps"][1]["step_seconds"] and all(r["dropped_groups"] == 0 for r in asy["steps"])
    assert 0 <= report["figures"]["async_trainer_idle_share"] <= 1
    # The same async run with its weights broadcast (gloo on CPU), each publish timed for both transports.
    cast = asy["broadcast"]
    assert cast["backend"] == "gloo" and [r["staleness_max"] for r in cast["steps"]] == [0, 1]
    assert all(r["updates"] >= 1 and r["dropped_groups"] == 0 for r in cast["steps"]) and _positive(cast["step_seconds"])
    assert len(asy["publish_seconds"]) == len(cast["publish_seconds"]) == 2
    assert all(_positive(t) for t in asy["publish_seconds"] + cast["publish_seconds"])
    assert report["model"]["params"] > 0 and set(report["part_seconds"]) == {"prepare", "rollout", "train", "async"}
    # The last printed line: name=value pairs, the ratio first.
    last = proc.stdout.strip().splitlines()[-2]
    assert last.split()[0].startswith("engine_vs_generate=")
    assert not list(tmp_path.glob("gpu_check.*/")), "the work folder was not removed"
