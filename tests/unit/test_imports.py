"""The import graph of `searchrl`, read from the source with `ast` (nothing is imported):

- module-level imports between searchrl modules form no cycle;
- a function-level import never closes one either (a lazy import is for a heavy library or a
  rarely used path, never to dodge a cycle);
- the text format (`tags`, `protocol`), the rewards and every `eval` module load neither the
  rollout engine nor the trainer: they work on `Trajectory` values, whoever produced them. The
  rollout config (which `eval run` nests) and the backend interface it names are no engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import searchrl

SRC = Path(searchrl.__file__).parent
ENGINE = ("searchrl.rollout", "searchrl.rl")
NOT_ENGINE = {"searchrl.rollout", "searchrl.rollout.config", "searchrl.rollout.backend"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, module: str, in_function: bool = False):
    """(imported searchrl module, whether the import runs inside a function) under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            continue  # never runs
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield alias.name, in_function
        elif isinstance(child, ast.ImportFrom):
            if child.level:  # relative: from the package holding `module`
                package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
                base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1])
                base = f"{base}.{child.module}" if child.module else base
            else:
                base = child.module or ""
            for alias in child.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in MODULES else base), in_function
        else:
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _imports(child, module, inner)


def _graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, all edges) between searchrl modules."""
    top: dict[str, set[str]] = {m: set() for m in MODULES}
    every: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, in_function in _imports(tree, module):
            if target in MODULES and target != module:
                every[module].add(target)
                if not in_function:
                    top[module].add(target)
    return top, every


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _loaded_by(module: str, graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Every module that importing `module` runs, with the import chain that reaches it; a module
    runs its parent packages' `__init__` first."""
    chains = {module: [module]}
    todo = [module]
    while todo:
        current = todo.pop()
        parents = {current.rsplit(".", i)[0] for i in range(1, current.count(".") + 1)} & graph.keys()
        for nxt in sorted(graph[current] | parents):
            if nxt not in chains:
                chains[nxt] = chains[current] + [nxt]
                todo.append(nxt)
    return chains


def test_graph_covers_the_package():
    top, _ = _graphs()
    assert {"searchrl", "searchrl.tags", "searchrl.protocol", "searchrl.eval.run"} <= set(top)
    assert "searchrl.tags" in top["searchrl.prompts"]  # `from searchrl.tags import ...`
    assert "searchrl.rollout.config" in top["searchrl.rl.config"]


def test_module_level_imports_have_no_cycle():
    top, _ = _graphs()
    cycle = _cycle(top)
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_no_function_level_import_closes_a_cycle():
    _, every = _graphs()
    cycle = _cycle(every)
    assert cycle is None, "import cycle through a function-level import: " + " -> ".join(cycle)


def test_text_format_rewards_and_eval_load_no_engine_or_trainer():
    top, _ = _graphs()
    checked = ["searchrl.tags", "searchrl.protocol", "searchrl.rewards"]
    checked += [m for m in MODULES if m.startswith("searchrl.eval.")]
    leaks = [
        " -> ".join(chain)
        for module in checked
        for name, chain in _loaded_by(module, top).items()
        if (name.startswith(tuple(f"{p}." for p in ENGINE)) or name in ENGINE) and name not in NOT_ENGINE
    ]
    assert not leaks, "imported at module level:\n" + "\n".join(leaks)
