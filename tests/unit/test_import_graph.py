"""The import graph of `searchrl`, read from the source with `ast` (nothing is imported). An edge
A -> B is an import in A's file of module B: `import B`, `from B import name`, or `from A import
b` where `A.b` is a module (then the edge goes to `A.b`, not to the package); relative imports are
resolved. Imports count wherever they sit: at module level, inside functions, and under
`if TYPE_CHECKING:` (which never runs, but still ties the two files together).

- module-level imports between searchrl modules form no cycle;
- a function-level import never closes one either (a lazy import is for a heavy library or a
  rarely used path, never to dodge a cycle);
- no two modules import each other, counting every import, `TYPE_CHECKING` ones too: a type
  two modules share lives in a third that both import (`eval.config`, `eval.report_config`,
  `tools.context`). A package's `__init__` importing a module inside that package is a
  re-export, not a dependency, so it never makes such a pair (a submodule importing its own
  package back at run time is still a cycle, caught above);
- the top-level packages and modules (`searchrl.rollout`, `searchrl.protocols`, ...) form no
  cycle either, counting every import, `TYPE_CHECKING` ones too: a module of one package that a
  module of another imports back ties the two into one knot, whichever modules the imports name
  (a type one package names from another is still a dependency on it);
- the protocols (`searchrl.protocols`), the rewards, every `eval` and every `data` module load
  neither the rollout engine nor the trainer at module level: they work on `Trajectory` values,
  whoever produced them (an eval command that runs a model loads the engine when it runs it);
- nothing under `searchrl.data` imports `searchrl.rollout`: the ground types know no job.
"""

from __future__ import annotations

import ast
import functools
import itertools
from pathlib import Path

import searchrl

SRC = Path(searchrl.__file__).parent
# What generates or trains: the rollout engine, the generation backends, the RL step and trainer.
ENGINE = {"searchrl.rollout.engine", "searchrl.rollout.hf_backend", "searchrl.rollout.vllm_backend",
          "searchrl.rl.actor", "searchrl.rl.step", "searchrl.rl.trainer"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, module: str, where: str = "module"):
    """(imported module, where the import sits: module | function | type_checking) under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            yield from _imports(ast.Module(child.body, []), module, "type_checking")
            yield from _imports(ast.Module(child.orelse, []), module, where)  # the else branch runs
        elif isinstance(child, ast.Import):
            for alias in child.names:
                yield alias.name, where
        elif isinstance(child, ast.ImportFrom):
            if child.level:  # relative: from the package holding `module`
                package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
                base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1])
                base = f"{base}.{child.module}" if child.module else base
            else:
                base = child.module or ""
            for alias in child.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in MODULES else base), where
        else:
            function = where == "module" and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _imports(child, module, "function" if function else where)


@functools.cache
def _edges() -> list[tuple[str, str, str]]:
    """(module, searchrl module it imports, where the import sits) over the package."""
    edges = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges += [(module, target, where) for target, where in _imports(tree, module) if target in MODULES and target != module]
    return edges


def _graph(*wheres: str) -> dict[str, set[str]]:
    """module -> the searchrl modules it imports, counting the imports that sit in `wheres`."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, target, where in _edges():
        if where in wheres:
            graph[module].add(target)
    return graph


def _graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, the edges of every import that runs) between searchrl modules."""
    return _graph("module"), _graph("module", "function")


def _is_reexport(importer: str, imported: str) -> bool:
    return MODULES[importer].name == "__init__.py" and imported.startswith(f"{importer}.")


def _mutual_pairs() -> set[tuple[str, str]]:
    """Every (a, b), a < b, where a imports b and b imports a, TYPE_CHECKING imports included."""
    graph = _graph("module", "function", "type_checking")
    return {
        (a, b)
        for a in graph
        for b in graph[a]
        if a < b and a in graph[b] and not _is_reexport(a, b) and not _is_reexport(b, a)
    }


def _package(module: str) -> str:
    """The top-level package or module of `module`: `searchrl.rollout.engine` -> `searchrl.rollout`."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """`graph` between top-level packages and modules: an edge for every import that crosses two."""
    packages: dict[str, set[str]] = {_package(m): set() for m in graph}
    for module, targets in graph.items():
        packages[_package(module)] |= {_package(t) for t in targets} - {_package(module)}
    return packages


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
    assert {"searchrl", "searchrl.protocols.tags", "searchrl.protocols.tagged", "searchrl.eval.run"} <= set(top)
    assert "searchrl.protocols.tags" in top["searchrl.protocols.prompts"]  # `from searchrl.protocols.tags import ...`
    assert "searchrl.rollout.agent" in top["searchrl.rl.config"]
    assert "searchrl.eval.resume" in top["searchrl.eval.run"]  # `from searchrl.eval import resume as saved`
    typed = _graph("type_checking")
    assert "searchrl.tools.context" in typed["searchrl.tools.base"]  # under `if TYPE_CHECKING:`
    assert "searchrl.tools.context" not in top["searchrl.tools.base"]


def test_the_graph_reads_every_kind_of_import(monkeypatch):
    source = (
        "from typing import TYPE_CHECKING\n"
        "import searchrl.protocols.tags\n"
        "from searchrl.eval import resume\n"  # a submodule, named by `from package import`
        "from searchrl.eval import summary as s\n"
        "from . import compare\n"
        "if TYPE_CHECKING:\n"
        "    from searchrl.rewards import FormatVerdict\n"
        "else:\n"
        "    from searchrl.metrics import ANSWER_METRICS\n"
        "def f():\n"
        "    from searchrl.eval.plots import bar_panels\n"
    )
    monkeypatch.setitem(MODULES, "searchrl.eval.probe", SRC / "eval" / "probe.py")  # a module, not a package
    found = dict(_imports(ast.parse(source), "searchrl.eval.probe"))
    assert found == {
        "typing": "module",
        "searchrl.protocols.tags": "module",
        "searchrl.eval.resume": "module",
        "searchrl.eval.summary": "module",
        "searchrl.eval.compare": "module",
        "searchrl.rewards": "type_checking",
        "searchrl.metrics": "module",
        "searchrl.eval.plots": "function",
    }


def test_module_level_imports_have_no_cycle():
    top, _ = _graphs()
    cycle = _cycle(top)
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_no_function_level_import_closes_a_cycle():
    _, every = _graphs()
    cycle = _cycle(every)
    assert cycle is None, "import cycle through a function-level import: " + " -> ".join(cycle)


def test_packages_form_no_cycle():
    every = _graph("module", "function", "type_checking")
    packages = _package_graph(every)
    assert {"searchrl.rollout", "searchrl.select", "searchrl.eval", "searchrl.protocols"} <= set(packages)
    cycle = _cycle(packages)
    assert cycle is None, "package-level import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(
        f"  {module} -> {target}" for a, b in itertools.pairwise(cycle) for module in sorted(every) if _package(module) == a
        for target in sorted(every[module]) if _package(target) == b)


def test_the_package_graph_sees_a_cycle_between_modules_of_two_packages():
    graph = {"searchrl.a.x": {"searchrl.b.y"}, "searchrl.b.y": set(), "searchrl.b.z": {"searchrl.a"}, "searchrl.a": set()}
    assert _cycle(graph) is None
    assert _cycle(_package_graph(graph)) in (["searchrl.a", "searchrl.b", "searchrl.a"], ["searchrl.b", "searchrl.a", "searchrl.b"])


def test_no_two_modules_import_each_other():
    pairs = _mutual_pairs()
    assert not pairs, "modules importing each other (move what both need into a third module):\n" + "\n".join(
        f"{a} <-> {b}" for a, b in sorted(pairs))


def test_a_package_reexporting_its_modules_is_no_pair():
    graph = _graph("module")
    assert "searchrl.tools.base" in graph["searchrl.tools"]  # the __init__ re-exports Tool
    assert _is_reexport("searchrl.tools", "searchrl.tools.base")
    assert not _is_reexport("searchrl.tools.base", "searchrl.tools")
    assert not _is_reexport("searchrl.eval.report", "searchrl.eval.report_table")  # not a package


def test_data_imports_no_rollout():
    every = _graph("module", "function", "type_checking")
    found = [
        f"{module} imports {target}"
        for module in MODULES
        if module.startswith("searchrl.data")
        for target in sorted(every[module])
        if _package(target) == "searchrl.rollout"
    ]
    assert not found, "\n".join(found)


def test_text_format_rewards_eval_and_data_load_no_engine_or_trainer():
    top, _ = _graphs()
    checked = ["searchrl.rewards", *(m for m in MODULES if m.startswith("searchrl.protocols"))]
    checked += [m for m in MODULES if m.startswith(("searchrl.eval.", "searchrl.data."))]
    leaks = [
        " -> ".join(chain)
        for module in checked
        for name, chain in _loaded_by(module, top).items()
        if name in ENGINE
    ]
    assert not leaks, "imported at module level:\n" + "\n".join(leaks)
