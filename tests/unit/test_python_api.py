"""The Python API guide's example runs as written (on tiny-random and the toy world's index), and
the API reference page documents every object it lists."""

from __future__ import annotations

import re
from pathlib import Path

from searchrl import docs_api

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "python.md"


def test_the_guides_first_example_runs(capsys):
    example = re.search(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S).group(1)
    assert len(example.strip().splitlines()) <= 12
    scope: dict = {}
    exec(compile(example, str(GUIDE), "exec"), scope)  # noqa: S102  (the repository's own docs)
    trajectory, reward = scope["trajectory"], scope["reward"]
    assert trajectory.question_id == "q1" and trajectory.segments and trajectory.segments[0].source == "policy"
    assert isinstance(reward.total, float)
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == f"{trajectory.queries} {trajectory.answer} {reward.total}"


def test_the_reference_page_documents_every_listed_object():
    page = docs_api.python_api_page()
    for _, paths in docs_api.API:
        for path in paths:
            name = path.split(":")[1]
            assert f"### `{name}`" in page
            assert docs_api._resolve(path).__doc__, f"{path} has no docstring to show"
    assert "```python\ncompute_reward(traj: Trajectory, golds: Sequence[str]" in page  # annotations unquoted


def test_the_site_names_its_version_and_links_the_repository_when_known(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("site_info", GUIDE.parents[1] / "hooks" / "site_info.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    config = hook.on_config({})
    assert config["copyright"].startswith("searchrl 0.") and "repo_url" not in config  # pyproject names none yet
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "9.1"\n[project.urls]\nRepository = "https://example.org/r"\n')
    assert hook.site_info(tmp_path) == {"version": "9.1", "commit": None, "repository": "https://example.org/r"}
