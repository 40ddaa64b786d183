"""bench/async.py --quick end to end on the tiny-random model: a sync run and an async run (its
rollout worker pinned to core 0, the trainer to core 1) with the long tail of forced searches, and
the last line reports the ratios first, then each mode's figures, the async trainer's seconds in the
weights hand-off and the mean staleness. Also the
`rollout.worker_cpus` checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl.errors import SearchRLError
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.worker_process import pin_cpus

BENCH = Path(__file__).resolve().parents[2] / "bench" / "async.py"
RATIOS = ["ratio_updates_per_h", "ratio_tok_s", "ratio_of_bound"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="bench/async.py pins two processes to a core each; this process may use one")
def test_bench_async_quick():
    cores = sorted(os.sched_getaffinity(0))[:2]
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--cpus", f"{cores[0]},{cores[1]}"],
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    pairs = dict(kv.split("=", 1) for kv in lines[-1].split())
    assert list(pairs)[:3] == RATIOS  # ratios first
    values = {k: float(v) for k, v in pairs.items() if k not in ("model", "dtype", "steps", "max_staleness")}
    assert all(v > 0 for k, v in values.items() if k not in ("trainer_idle_share", "async_publish_s")), values
    # Printed with 3 decimals: the ratios are the quotients of the printed figures, to rounding.
    assert values["ratio_updates_per_h"] == pytest.approx(values["async_updates_per_h"] / values["sync_updates_per_h"], rel=0.01)
    assert values["ratio_of_bound"] == pytest.approx(values["ratio_updates_per_h"] / values["bound"], rel=0.01, abs=2e-3)
    assert values["bound"] >= 1.0  # a step over the longer of its two parts
    # At max_staleness 1 every timed step (after the first) trains on the previous version's rollouts.
    assert values["staleness_mean"] == pytest.approx(1.0)
    assert 0 <= values["trainer_idle_share"] <= 1
    assert (pairs["model"], pairs["dtype"], pairs["max_staleness"]) == ("tiny-random", "bfloat16", "1")
    # The update's seconds hold the weights hand-off (tiny-random's: milliseconds), which only async does.
    assert 0 <= values["async_publish_s"] < values["async_update_s"]
    assert values["update_slowdown"] == pytest.approx((values["async_update_s"] - values["async_publish_s"]) / values["sync_update_s"], rel=0.02, abs=2e-3)
    assert any(ln.startswith("sync ") for ln in lines) and any(ln.startswith("async ") for ln in lines)


def test_worker_cpus_are_checked():
    assert RolloutConfig(worker_cpus=[0]).worker_cpus == [0]
    for bad in ([], [0, 0], [-1]):
        with pytest.raises(ValueError):
            RolloutConfig(worker_cpus=bad)
    with pytest.raises(SearchRLError, match="cannot pin the trainer to cores"):
        pin_cpus([10_000], "the trainer")
