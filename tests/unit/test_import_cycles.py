"""No import cycle inside ``processor``, type-only and function-level imports included.

A cycle makes two modules one: neither can be read, tested or moved without the other, and a
lazy import that hides one only moves the failure to run time. The modules' imports are those
the layer test reads (``tests/unit/test_purity.py``). A package importing its own submodules (to
offer their names) is not a cycle of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from tests.unit.test_purity import MODULES, _target


def _graph(modules: Mapping[str, set[str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for rel, names in modules.items():
        package = rel.removesuffix("__init__.py") if rel.endswith("__init__.py") else None
        targets = {t for n in names if (t := _target(n, modules)) is not None and t != rel}
        if package is not None:
            targets = {t for t in targets if not t.startswith(package)}
        graph[rel] = targets
    return graph


def cycles(modules: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    graph = _graph(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: list[str] = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_imports_itself_back() -> None:
    assert cycles(MODULES) == []


def test_the_cycle_check_sees_a_planted_type_only_cycle() -> None:
    # The runtime's processor and its observability once imported each other, one side only
    # under TYPE_CHECKING: the reader counts that import like any other.
    planted = {rel: set(names) for rel, names in MODULES.items()}
    planted["_runtime/observe.py"].add("processor._runtime.processor.Processor")
    assert ["_runtime/loops.py", "_runtime/observe.py", "_runtime/processor.py"] in cycles(planted)
