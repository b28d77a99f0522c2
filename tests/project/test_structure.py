"""The product's structure, read from its own imports (ast; nothing is imported): no import circles,
no private name taken from another module, nothing from the bench, one owner per shared helper."""

from __future__ import annotations

import ast
import inspect
from functools import cache
from graphlib import TopologicalSorter
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "gen_pipeline"


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PKG.rglob("*.py"))}


def imports(tree: ast.Module) -> list[tuple[str, str]]:
    """(module, name) of every `from X import name` anywhere in the file (TYPE_CHECKING and function
    bodies included: a lazy import is still an arrow); `import X` gives (X, "")."""
    out: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
    return out


def arrows() -> dict[str, set[str]]:
    """Module → the product modules it imports; a package's __init__ (a face that hands names on) is
    neither end of an arrow, and `from pkg import mod` points at mod."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods if not PKG.joinpath(*m.split(".")[1:], "__init__.py").exists()}
    for m in graph:
        for target, name in imports(mods[m]):
            dest = f"{target}.{name}" if f"{target}.{name}" in mods else target
            if dest in graph and dest != m:
                graph[m].add(dest)
    return graph


def test_no_import_circles() -> None:
    TopologicalSorter(arrows()).prepare()  # CycleError names a circle


def test_no_module_takes_another_modules_private_name() -> None:
    taken = sorted(f"{m} <- {target}.{name}" for m, tree in modules().items() for target, name in imports(tree)
                   if target.startswith("gen_pipeline") and target != m and name.startswith("_")
                   and not name.startswith("__"))
    assert taken == []


def test_the_product_does_not_import_the_bench() -> None:
    assert sorted(m for m, tree in modules().items() for target, _ in imports(tree)
                  if target == "bench" or target.startswith("bench.")) == []
    # no product parameter exists for a benchmark: the job's datasets start one after the other; the bench's
    # all-at-once variant (bench/job_bench.py) starts the dispatchers' public `produce` itself
    from gen_pipeline.run.dispatch import produce_in_order

    assert list(inspect.signature(produce_in_order).parameters) == ["requests", "dispatchers", "launch"]


def test_shared_helpers_have_one_owner() -> None:
    """A helper several modules need is defined once (a copy drifts): where each is defined."""
    names = ("first_known", "pid_alive", "group_alive", "normalise_server_url", "iter_committed_samples")
    where = {n: sorted(m for m, tree in modules().items() for node in tree.body
                       if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == n) for n in names}
    assert where == {"first_known": ["gen_pipeline.errors"], "pid_alive": ["gen_pipeline.store.lock"],
                     "group_alive": ["gen_pipeline.server.leftover"],
                     "normalise_server_url": ["gen_pipeline.config.server"],
                     "iter_committed_samples": ["gen_pipeline.store.layout"]}


def test_server_urls_are_normalised_where_they_come_in() -> None:
    """The flags' URLs are normalised as options are built (RunOptions, probe-kv's); the server layer
    takes them as they are."""
    calls = sorted(m for m, tree in modules().items() for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and getattr(node.func, "id", "") == "normalise_server_url")
    assert [m for m in calls if m.startswith("gen_pipeline.server")] == []
    assert {"gen_pipeline.run.options", "gen_pipeline.probe.core"} <= set(calls)


def test_package_docstrings_say_what_the_package_is_for_without_a_module_map() -> None:
    """A list of a package's modules in its docstring drifts (20 of 76 modules were missing, 2 gone):
    the tree is the map."""
    maps = sorted(f"{m}: {line.strip()}" for m, tree in modules().items()
                  if PKG.joinpath(*m.split(".")[1:], "__init__.py").exists()
                  for line in (ast.get_docstring(tree) or "").splitlines()
                  if line.strip().split(" ")[0].endswith(".py"))
    assert maps == []
    # figures live on one generated page (docs/measurements.md): a comment says why and points there
    pointing = sorted(str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py")
                      if "RESULTS.md" in p.read_text() and p.name != "chat.py")  # chat.py: split under way
    assert pointing == []
