"""The query side's modules import each other without a cycle, lazy imports included.

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ...
import`` in ``serving/``, at module level or inside a function, is an edge. A cycle there
means two modules that cannot be read, or changed, one below the other; the one that
existed (``search.py`` → ``sira/`` → ``search.py`` for its error types) was broken by
giving the errors ``serving/errors.py``, which imports nothing of funnel's.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVING = Path(__file__).resolve().parent.parent / "serving"


def module_name(path: Path) -> str:
    parts = path.relative_to(SERVING.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The ``serving`` modules that ``path`` imports (relative or ``funnel.serving...``)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = (node.module or "").removeprefix("funnel.")
            names = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            base, names = "", [a.name.removeprefix("funnel.") for a in node.names]
        else:
            continue
        for name in names:
            target = name if name in known else base
            if target in known and target != me:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    paths = sorted(SERVING.rglob("*.py"))
    known = {module_name(p) for p in paths}
    return {module_name(p): imports(p, known) for p in paths}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_graph_sees_lazy_and_relative_imports():
    g = graph()
    assert "serving.sira.mode" in g["serving.search"]          # lazy, inside a method
    assert "serving.errors" in g["serving.sira.mode"]          # relative, two levels up
    assert "serving.kernels" in g["serving.sira.batch"]        # `from .. import kernels`


def test_serving_has_no_import_cycle():
    assert cycles(graph()) == []


def test_errors_module_is_a_leaf():
    assert graph()["serving.errors"] == set()
    tree = ast.parse((SERVING / "errors.py").read_text())
    # It may import the artifact contract's error (IndexDamaged is an IndexFormatError), which
    # imports nothing of serving; nothing else of funnel.
    assert not any(isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("funnel"))
                   and n.module != "funnel.pipelines.store.artifacts" for n in ast.walk(tree))


def test_errors_are_the_same_classes_from_either_module():
    from funnel.serving import errors, search
    from funnel.serving.sira import mode
    assert search.SearchError is errors.SearchError and search.ModeUnavailable is errors.ModeUnavailable
    assert mode.SearchError is errors.SearchError and issubclass(errors.ModeUnavailable, errors.SearchError)
