"""bench/rl_throughput.py: every lever is a valid change of the multi-hop recipe's RL stage, and
--quick runs today's configuration and a new one end to end on the tiny-random model, the last
line giving the ratios first."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl.config import load_config
from searchrl.rl.config import TrainConfig

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rl_throughput.py"
spec = importlib.util.spec_from_file_location("rl_throughput", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("lever", sorted(bench.LEVERS))
def test_each_lever_changes_only_what_it_names(lever, tmp_path):
    args = argparse.Namespace(model="tiny-random", steps=2, warmup=1, quick=False)
    config = str(BENCH.parents[1] / "configs" / "multihop-cpu.yaml")
    today = load_config(TrainConfig, config, bench.overrides(args, [], tmp_path))
    lever_cfg = load_config(TrainConfig, config, bench.overrides(args, [lever], tmp_path))
    # The RL stage of the recipe, from the checkpoint, for warm-up + timed steps.
    assert (today.stage1.enabled, today.stage2.enabled, today.stage2.steps) == (False, True, 3)
    assert (today.stage2.prompts_per_step, today.stage2.samples_per_prompt) == (4, 8)
    a, b = _flat(today.model_dump()), _flat(lever_cfg.model_dump())
    changed = {k for k in a if a[k] != b[k]}
    named = {o.split("=")[0] for o in bench.LEVERS[lever]}
    assert changed and changed <= named, (changed, named)  # (a lever may name a default, e.g. max_staleness 1)


def _flat(tree: dict, prefix: str = "") -> dict:
    """{"a.b": value} for the nested config dump."""
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_bench_rl_throughput_quick():
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--steps", "1", "--new", "micro8"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines[2:4]] == ["today", "micro8"]  # the table: today, then the new configuration
    pairs = dict(kv.split("=", 1) for kv in lines[-1].split())
    assert list(pairs)[:2] == ["speedup_rollouts_per_h", "speedup_tok_s"]  # ratios first
    values = {k: float(v) for k, v in pairs.items() if k not in ("new", "steps")}
    assert values["speedup_rollouts_per_h"] == pytest.approx(values["new_rollouts_per_h"] / values["today_rollouts_per_h"], rel=0.01)
    assert values["today_rollouts_per_h"] > 0 and pairs["new"] == "micro8"
