"""The layering of the package, checked on its source: the trainer (`searchrl.rl`) meets
retrieval only through the rollout layer (docs/concepts/architecture.md). It publishes weights
and takes trajectories; the rollout layer opens, checks and searches the retriever."""

from __future__ import annotations

import ast
from pathlib import Path

import searchrl

RL = Path(searchrl.__file__).parent / "rl"
# The train command's one typed config composes every layer's config, retrieval's included.
ALLOWED = {"config.py"}


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


def retrieval_imports(folder: Path, package: str) -> list[str]:
    """'module.py:line imports name' for each import of searchrl.retrieval in `folder`'s modules."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        if path.relative_to(folder).as_posix() in ALLOWED:
            continue
        for line, name in imported_modules(path.read_text(encoding="utf-8"), package):
            if name == "searchrl.retrieval" or name.startswith("searchrl.retrieval."):
                found.append(f"{path.relative_to(folder.parent).as_posix()}:{line} imports {name}")
    return sorted(set(found))


def test_the_trainer_imports_no_retrieval_module_but_its_config():
    offenders = retrieval_imports(RL, "searchrl.rl")
    assert not offenders, (
        "the trainer sees retrieval only through the rollout layer (searchrl.rollout, e.g. "
        "rollout.run_search); move this use there:\n  " + "\n  ".join(offenders)
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
    assert retrieval_imports(tmp_path / "rl", "searchrl.rl") == [
        "rl/late.py:2 imports searchrl.retrieval.querycache.RetrievalCounts",
        "rl/name.py:1 imports searchrl.retrieval",
        "rl/plain.py:2 imports searchrl.retrieval.base",
        "rl/relative.py:1 imports searchrl.retrieval.base",
    ]
