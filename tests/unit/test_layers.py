"""The layering of the package, checked on its source (docs/concepts/architecture.md): the trainer
(`searchrl.rl`) meets retrieval only through the rollout layer, and the rollout layer knows
nothing of the trainer. The trainer publishes versioned weights and takes versioned
trajectories; the rollout layer opens, checks and searches the retriever, and its workers run a
config of their own (`rollout.worker_config`), which the trainer builds."""

from __future__ import annotations

import ast
from pathlib import Path

import searchrl

PACKAGE = Path(searchrl.__file__).parent


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, a module of `package`: `import x` gives
    x, `from x import a` gives x.a (a may be a submodule); relative imports resolved."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def imports_of(folder: Path, package: str, forbidden: str) -> list[str]:
    """'module.py:line imports name' for each import of `forbidden` (a package, or a module of
    it) in `folder`'s modules (package `package`)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for line, name in imported_modules(path.read_text(encoding="utf-8"), package):
            if name == forbidden or name.startswith(forbidden + "."):
                found.append(f"{path.relative_to(folder.parent).as_posix()}:{line} imports {name}")
    return sorted(set(found))


def test_the_trainer_imports_no_retrieval_module():
    offenders = imports_of(PACKAGE / "rl", "searchrl.rl", "searchrl.retrieval")
    assert not offenders, (
        "the trainer sees retrieval only through the rollout layer (searchrl.rollout, e.g. "
        "rollout.run_search; its config's retrieval section is the agent's, rollout.agent.AgentConfig); "
        "move this use there:\n  " + "\n  ".join(offenders)
    )


def test_the_rollout_layer_imports_nothing_of_the_trainer():
    offenders = imports_of(PACKAGE / "rollout", "searchrl.rollout", "searchrl.rl")
    assert not offenders, (
        "the rollout layer must not depend on the trainer (searchrl.rl): its workers run a "
        "rollout.worker_config.WorkerConfig, which the trainer builds (TrainConfig.worker_config); "
        "take what this module needs as an argument or from the rollout layer:\n  " + "\n  ".join(offenders)
    )


def test_the_check_finds_every_form_of_import(tmp_path):
    """The check itself: each way of writing the import is caught, with module, line and name."""
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "plain.py").write_text("import os\nimport searchrl.retrieval.base as b\n")
    (tmp_path / "rl" / "late.py").write_text("def f():\n    from searchrl.retrieval.querycache import RetrievalCounts\n")
    (tmp_path / "rl" / "name.py").write_text("from searchrl import retrieval\n")
    (tmp_path / "rl" / "relative.py").write_text("from ..retrieval import base\n")
    (tmp_path / "rl" / "config.py").write_text("from searchrl.retrieval import RetrievalConfig\n")
    (tmp_path / "rl" / "fine.py").write_text("from searchrl.rollout.run_search import RunSearch\nimport searchrl.retrievals\n")
    assert imports_of(tmp_path / "rl", "searchrl.rl", "searchrl.retrieval") == [
        "rl/config.py:1 imports searchrl.retrieval.RetrievalConfig",
        "rl/late.py:2 imports searchrl.retrieval.querycache.RetrievalCounts",
        "rl/name.py:1 imports searchrl.retrieval",
        "rl/plain.py:2 imports searchrl.retrieval.base",
        "rl/relative.py:1 imports searchrl.retrieval.base",
    ]
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from searchrl.rl.config import TrainConfig\n")
    (tmp_path / "rollout" / "late.py").write_text("def f():\n    from ..rl.policy import autocast\n")
    (tmp_path / "rollout" / "fine.py").write_text("from searchrl.rollout.worker_config import WorkerConfig\nimport searchrl.rlx\n")
    assert imports_of(tmp_path / "rollout", "searchrl.rollout", "searchrl.rl") == [
        "rollout/late.py:2 imports searchrl.rl.policy.autocast",
        "rollout/typed.py:3 imports searchrl.rl.config.TrainConfig",
    ]
