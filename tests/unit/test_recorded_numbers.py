"""Headline numbers cannot drift: every page that states a recorded result (README, getting
started, the results pages' demo and multi-hop rows) states the figure `results/recorded.json` holds.

A claim is a passage of a page, whitespace-insensitive, with `{entry.key}` where a recorded figure
stands: `{entry.key:%}` for a fraction the page writes in percent, `{entry.key:*20}` for one it
writes as a count of 20. The page's number must equal the recorded one at the precision the page
writes it. A page reworded so a claim no longer matches fails too: update the claim with it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from searchrl import recorded

ROOT = Path(__file__).resolve().parents[2]
_SLOT = re.compile(r"\{([\w-]+)\.(\w+)(?::([^}]*))?\}")
_NUMBER = r"([+-]?\d+(?:\.\d+)?)"

DEMO_STAGE1 = "goes {demo.stage1_search_first} → {demo.stage1_search_last} and the format-ok rate {demo.stage1_format_first} → {demo.stage1_format_last}"
CLAIMS: dict[str, list[str]] = {
    "README.md": [
        DEMO_STAGE1 + "; on 20 held-out questions the trained agent's exact match goes {demo.untrained_agent_em:%} → "
        "{demo.trained_agent_em:%} %, still below retrieval in the prompt ({demo.untrained_rag_em:%} %)",
        "does beat rag: EM {multihop.em:%} against {multihop.rag_em:%} on 200 held-out questions",
        "Stage-1 format-ok {demo.stage1_format_first} → **{demo.stage1_format_last}**; held-out EM "
        "{demo.untrained_agent_em:%} → **{demo.trained_agent_em:%}** (rag: {demo.untrained_rag_em:%})",
        "EM **{multihop.em:%}** vs rag {multihop.rag_em:%} ({multihop.em_minus_rag:%}, 95 % interval "
        "[{multihop.em_minus_rag_low:%}, {multihop.em_minus_rag_high:%}]); bridge + inference EM **{multihop.bridge_inference_em:%} %**",
        "on a world it never saw, EM **{multihop.alt_em:%}** vs rag {multihop.alt_rag_em:%}",
        "rollouts that search {toolcall.stage1_search_first} → **{toolcall.stage1_search_last}**; held-out F1 "
        "{toolcall.heldout_f1_first:%} → **{toolcall.heldout_f1_last:%}**",
        "cover-EM **{benchmarks.paper_cover_em:%}** and ACC_L **{benchmarks.paper_acc_l:%}**",
        "**{benchmarks.async_updates_per_hour}×** the updates per hour",
        "**{benchmarks.rollout_speedup}×** faster",
        "**{benchmarks.trainer_time_vs_trl}×** the time, **{benchmarks.trainer_memory_vs_trl}×** the memory",
        "**{benchmarks.server_throughput_64}×** the throughput",
        "recall@10 **{benchmarks.dense_recall_at_10}** in **{benchmarks.dense_memory_vs_flat:%} %**",
    ],
    "docs/getting-started.md": [
        DEMO_STAGE1 + "; the trained agent answers {demo.trained_agent_em:%} % of the test questions exactly "
        "(the untrained one {demo.untrained_agent_em:%} %)",
    ],
    "docs/results/demo.md": [
        "| Stage 1: share of rollouts that search | {demo.stage1_search_first} | **{demo.stage1_search_last}** (from step 3) |",
        "| Stage 1: format-ok rate | {demo.stage1_format_first} | **{demo.stage1_format_last}** (from step 4) |",
        "| Stage 2: mean answer F1, first vs last quarter of the steps | {demo.stage2_f1_first_quarter} | "
        "**{demo.stage2_f1_last_quarter}** |",
        "| Stage 2: format-ok rate, first vs last quarter | {demo.stage2_format_first_quarter} | {demo.stage2_format_last_quarter} |",
        "| untrained agent | {demo.untrained_agent_em:%} | {demo.untrained_agent_f1:%} |",
        "| untrained rag | **{demo.untrained_rag_em:%}** |",
        "| **trained agent** | {demo.trained_agent_em:%} | {demo.trained_agent_f1:%} | {demo.trained_agent_cover_em:%} "
        "| **100** | 100 | {demo.trained_agent_support:%} |",
        "| 1. the demo (Stage 2 on `toyworld:selected` comparisons) | **{demo-echo.trained_agent_em:%}** | "
        "**{demo-echo.trained_agent_f1:%}** | 100 | **{demo-echo.trained_agent_echo:*20}** |",
    ],
    "docs/results/multihop.md": [
        "EM {multihop.em:%} against {multihop.rag_em:%}, {multihop.em_minus_rag:%} [{multihop.em_minus_rag_low:%}, "
        "{multihop.em_minus_rag_high:%}] points",
    ],
    "docs/results/speed.md": ["**Async/sync: {benchmarks.async_updates_per_hour}× updates per hour**"],
}


def _pattern(claim: str) -> tuple[re.Pattern, list[tuple[str, str, str]]]:
    """The claim as a regex (its text literal, whitespace any run of whitespace, each slot a
    number) and its slots in order."""
    parts, slots, at = [], [], 0
    for m in _SLOT.finditer(claim):
        parts.append(re.escape(claim[at:m.start()]))
        parts.append(_NUMBER)
        slots.append((m.group(1), m.group(2), m.group(3) or ""))
        at = m.end()
    parts.append(re.escape(claim[at:]))
    text = "".join(parts).replace("\\ ", " ")
    return re.compile(re.sub(r" +", r"\\s+", text)), slots


def _as_written(value: float, how: str) -> float:
    if how == "%":
        return value * 100
    if how.startswith("*"):
        return value * float(how[1:])
    return value


def _claims():
    for page, claims in CLAIMS.items():
        for claim in claims:
            yield pytest.param(page, claim, id=f"{page}:{claim[:40]}")


@pytest.mark.parametrize(("page", "claim"), list(_claims()))
def test_page_states_the_recorded_figure(page, claim):
    pattern, slots = _pattern(claim)
    text = (ROOT / page).read_text(encoding="utf-8")
    m = pattern.search(text)
    assert m, f"{page}: no passage matches the claim (reworded? update the claim in this test): {claim}"
    for (name, key, how), written in zip(slots, m.groups()):
        decimals = len(written.split(".")[1]) if "." in written else 0
        expected = round(_as_written(recorded.figure(name, key), how), decimals)
        assert float(written) == expected, f"{page} states {name}.{key} as {written}; recorded: {expected} (results/recorded.json)"


def test_a_changed_figure_fails_its_claim(tmp_path):
    pattern, slots = _pattern("held-out EM {demo.untrained_agent_em:%} → **{demo.trained_agent_em:%}**")
    m = pattern.search("Stage 1 ...; held-out EM 0 →\n**20** (rag: 25)")
    assert m and slots[1] == ("demo", "trained_agent_em", "%")
    written = m.group(2)
    assert float(written) != round(_as_written(recorded.figure("demo", "trained_agent_em"), "%"), 0)


def test_every_entry_says_how_it_was_measured():
    for name, entry in recorded.load().items():
        assert {"what", "date", "machine", "threads", "libraries", "figures"} <= set(entry), name
        assert all(isinstance(v, (int, float)) for v in entry["figures"].values()), name


def _demo_folder(out: Path, trained_em: float) -> Path:
    (out / "summary.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({
        "seconds": 500, "stage1": {"search_rate_first": 0.75, "search_rate_last": 1.0, "format_ok_first": 0.1875,
                                   "format_ok_last": 1.0},
        "stage2": {"answer_f1_first_quarter": 0.2, "answer_f1_last_quarter": 0.4, "format_ok_first_quarter": 0.9,
                   "format_ok_last_quarter": 1.0}}))
    for folder, em in (("eval-untrained-agent", 0.0), ("eval-untrained-rag", 0.25), ("eval-trained-agent", trained_em)):
        (out / folder).mkdir()
        (out / folder / "metrics.json").write_text(json.dumps(
            {"em": em, "f1": em, "cover_em": em, "retrieval_recall": 0.3, "query_echo_rate": 0.5}))
    (out / "run_info.json").write_text(json.dumps({
        "start": "2026-12-08T01:00:00+00:00", "threads_env": {"OMP_NUM_THREADS": "1"},
        "libraries": {"torch": "2.13.0", "transformers": "5.24.0", "numpy": "2.0"}}))
    return out


def test_recording_a_demo_folder_writes_its_figures_and_provenance(tmp_path, capsys):
    out = _demo_folder(tmp_path / "demo", trained_em=0.35)
    registry = tmp_path / "recorded.json"
    registry.write_text(json.dumps({"other": {"figures": {"x": 1}}}))
    recorded.main(["demo", str(out), "--what", "make demo", "--machine", "2 cores", "--registry", str(registry)])
    entries = recorded.load(registry)
    assert entries["other"] == {"figures": {"x": 1}}  # other entries kept
    demo = entries["demo"]
    assert demo["date"] == "2026-12-08" and demo["threads"] == 1
    assert demo["libraries"] == {"torch": "2.13.0", "transformers": "5.24.0"}
    assert demo["figures"]["trained_agent_em"] == 0.35 and demo["figures"]["untrained_rag_em"] == 0.25
    assert demo["figures"]["stage2_f1_last_quarter"] == 0.4 and demo["figures"]["trained_agent_echo"] == 0.5
    assert recorded.figure("demo", "trained_agent_em", registry) == 0.35


def test_an_unfinished_demo_is_refused(tmp_path):
    out = _demo_folder(tmp_path / "demo", trained_em=0.1)
    (out / "eval-trained-agent" / "metrics.json").unlink()
    with pytest.raises(recorded.SearchRLError, match="did not finish"):
        recorded.demo_figures(out)
