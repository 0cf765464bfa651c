"""Layering: who may import the Kafka and PostgreSQL clients, their adapters, and the CLI.

The authoring API, the examples and the schemas import no client at all (checked by importing
them); inside ``processor`` every module's import statements are read with ``ast``, so an
import inside a function or under ``TYPE_CHECKING`` counts as much as one at the top.
"""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import processor

ROOT = Path(processor.__file__).parent

CHECK = """
import sys
import processor, processor.runner, processor.testing, sagas, schemas, schemas.export
import processor.participant, processor.asyncapi, processor.memory.participant, demo.orders
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('confluent_kafka', 'psycopg'))
print(','.join(heavy))
"""


def test_pure_modules_do_not_import_kafka_or_postgres_clients() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_public_api_is_curated() -> None:
    import processor

    assert "SagaFixture" not in processor.__all__
    for name in processor.__all__:
        assert hasattr(processor, name), name
    assert processor.message_registry is processor.messages.registry


# -- imports inside the package ---------------------------------------------------------------

# The layers, lowest first: a module imports only from its own layer or a lower one, so an
# upward import anywhere fails `test_no_module_imports_from_a_higher_layer`. Paths are relative
# to the package; a directory entry covers everything below it. docs/architecture.md explains
# each layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("errors.py", "wire.py")),
    (
        "authoring",
        (
            "messages.py",
            "handles.py",
            "params.py",
            "_choices.py",
            "_marks.py",
            "_saga_model.py",
            "definition.py",
            "upcasting.py",
            "binding.py",
            "runner/",
            "machine/",
            "asyncapi.py",
        ),
    ),
    ("engine", ("engine/",)),
    ("ports", ("ports/",)),
    ("application", ("participant/", "settings/", "application.py")),
    ("adapters", ("memory/", "postgres/", "kafka/")),
    ("observe", ("observe/",)),
    ("runtime", ("runtime/",)),
    ("ops", ("ops/",)),
    ("composition", ("bootstrap/",)),
    ("entry points", ("cli/", "console/", "testing/", "publish/", "__main__.py", "__init__.py")),
)
CLIENTS = {"postgres/": "psycopg", "kafka/": "confluent_kafka"}
ADAPTER_PACKAGES = ("memory/", "postgres/", "kafka/")
# Who may name an adapter: the composition root builds every one; the test kits run the saga
# and participant fixtures over the in-memory ones.
MAY_IMPORT_ADAPTERS = ("bootstrap/", "testing/")
CLI_ENTRIES = ("cli/", "__main__.py")


SOURCES = {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def _modules() -> dict[str, set[str]]:
    """Every module of the package (path relative to it) and the names of all it imports."""
    found: dict[str, set[str]] = {}
    for rel, text in SOURCES.items():
        package = ["processor", *rel.split("/")[:-1]]
        names: set[str] = set()
        for node in ast.walk(ast.parse(text, filename=rel)):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                names.add(module)
                # `from processor import postgres` imports the subpackage itself.
                names.update(f"{module}.{a.name}" for a in node.names)
        found[rel] = names
    return found


def _under(rel: str, prefixes: tuple[str, ...]) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)


def _imports(names: set[str], module: str) -> bool:
    return any(n == module or n.startswith(module + ".") for n in names)


def _layer(rel: str) -> int | None:
    return next((i for i, (_, paths) in enumerate(LAYERS) if _under(rel, paths)), None)


def _target(name: str, modules: Mapping[str, object]) -> str | None:
    """The module a dotted name inside the package resolves to (the longest that exists)."""
    parts = name.split(".")
    if parts[0] != "processor":
        return None
    for n in range(len(parts), 0, -1):
        rel = "/".join(parts[1:n])
        for candidate in (f"{rel}.py", f"{rel}/__init__.py" if rel else "__init__.py"):
            if candidate in modules:
                return candidate
    return None


def upward_imports(modules: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a module in a higher layer than the importer."""
    wrong: list[tuple[str, str]] = []
    for rel, names in modules.items():
        own = _layer(rel)
        for name in sorted(names):
            target = _target(name, modules)
            if own is None or target is None:
                continue
            other = _layer(target)
            if other is not None and other > own:
                wrong.append((rel, target))
    return sorted(set(wrong))


MODULES = _modules()


def test_every_module_is_placed_in_a_layer() -> None:
    assert MODULES, ROOT
    unplaced = [m for m in MODULES if _layer(m) is None]
    assert unplaced == [], "add new modules to LAYERS"


def test_no_module_imports_from_a_higher_layer() -> None:
    assert upward_imports(MODULES) == []


def test_the_layer_check_sees_a_planted_upward_import() -> None:
    # Guards the check above against passing because it resolves nothing.
    planted = {rel: set(names) for rel, names in MODULES.items()}
    planted["engine/plan.py"].add("processor.runtime.worker")
    planted["postgres/batch.py"].add("processor.ops.parked.retry_parked_saga")
    found = upward_imports(planted)
    assert ("engine/plan.py", "runtime/worker.py") in found
    assert ("postgres/batch.py", "ops/parked.py") in found


# -- what a port hands back -------------------------------------------------------------------

# A port is often implemented above the layer that calls it (the composition root implements the
# factory port the runtime calls), and the import check cannot see what an implementation does
# for its caller: a port method that handed back, or ran, code of a layer above the caller would
# take the caller there by the back door (the runtime once resumed parked sagas through ops/ so).
# So neither a port method's return annotation nor an implementation of it (its annotations and
# its body) names a module above the port's lowest caller, but for the adapters (what a port is
# for) and the implementation's own package.


def _bindings(tree: ast.AST, rel: str) -> dict[str, str]:
    """Each name a module binds by an import (anywhere in it), to the dotted name it stands for."""
    package = ["processor", *rel.split("/")[:-1]]
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.update({a.asname or a.name: f"{module}.{a.name}" for a in node.names})
    return out


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _named(nodes: Iterable[ast.AST], bindings: Mapping[str, str], annotation: bool) -> set[str]:
    """The dotted names of the package ``nodes`` refer to (strings too, in an annotation)."""
    out: set[str] = set()
    for root in nodes:
        for node in ast.walk(root):
            if annotation and isinstance(node, ast.Constant) and isinstance(node.value, str):
                with contextlib.suppress(SyntaxError):
                    out |= _named([ast.parse(node.value, mode="eval")], bindings, True)
            dotted = _dotted(node) if isinstance(node, ast.Name | ast.Attribute) else None
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            target = bindings.get(head, "processor" if head == "processor" else None)
            if target is not None:
                out.add(f"{target}.{rest}" if rest else target)
    return out


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name[:2] != "__"}


def _top(rel: str) -> str:
    return rel.split("/", maxsplit=1)[0] + "/" if "/" in rel else rel


def port_leaks(sources: Mapping[str, str]) -> list[tuple[str, str]]:
    """(port method or implementation, module) for each higher module a port hands its caller."""
    trees = {rel: ast.parse(text, filename=rel) for rel, text in sources.items()}
    bindings = {rel: _bindings(tree, rel) for rel, tree in trees.items()}
    ports: dict[str, tuple[str, ast.ClassDef, dict[str, ast.FunctionDef]]] = {}
    for rel, tree in trees.items():
        for c in tree.body if rel.startswith("ports/") else []:
            if isinstance(c, ast.ClassDef) and "Protocol" in {
                _dotted(b.value if isinstance(b, ast.Subscript) else b) for b in c.bases
            }:
                ports[c.name] = (rel, c, _methods(c))

    def inherited(c: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        bases = [ports[b][1] for b in map(_dotted, c.bases) if b in ports]
        return {k: f for base in bases for k, f in inherited(base).items()} | _methods(c)

    ports = {name: (rel, c, inherited(c)) for name, (rel, c, _) in ports.items()}
    leaks: set[tuple[str, str]] = set()
    for name, (port_rel, _, methods) in ports.items():
        implementations = [
            (rel, c)
            for rel, tree in trees.items()
            if not rel.startswith("ports/")
            for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef)
            and (
                any(bindings[rel].get(str(_dotted(b)), "").endswith("." + name) for b in c.bases)
                # By shape too, when the port has more than a name in common with a class.
                or (len(methods) > 1 and set(methods) <= set(_methods(c)))
            )
        ]
        callers = [
            layer
            for rel, bound in bindings.items()
            if not rel.startswith("ports/")
            if any(
                t.startswith("processor.ports") and t.endswith("." + name) for t in bound.values()
            )
            if (layer := _layer(rel)) is not None
        ]
        if not callers:
            continue
        lowest = min(callers)
        found = [
            (f"{port_rel}:{name}.{m}", port_rel, _named([f.returns], bindings[port_rel], True))
            for m, f in methods.items()
            if f.returns is not None
        ]
        found += [
            (f"{rel}:{c.name}.{m}", rel, _named([f], bindings[rel], False))
            for rel, c in implementations
            for m, f in _methods(c).items()
            if m in methods
        ]
        for where, rel, names in found:
            for target in filter(None, (_target(n, trees) for n in names)):
                layer = _layer(target)
                if (
                    layer is not None
                    and layer > lowest
                    and not _under(target, ADAPTER_PACKAGES)
                    and _top(target) != _top(rel)
                ):
                    leaks.add((where, target))
    return sorted(leaks)


def test_no_port_hands_its_caller_a_higher_layer() -> None:
    assert port_leaks(SOURCES) == []


PLANTED_PORT = """
from collections.abc import Callable
from typing import Protocol

from processor.ops.parked import RetryResult


class Resumer(Protocol):
    def resume(self) -> Callable[[], list[RetryResult]]: ...
"""
# The detour this check was written for: the factory port's implementation handing the runtime
# (its caller) a function of ops/, or running one for it.
PLANTED_DETOUR = """
from processor.ops.parked import list_parked, retry_parked_saga
from processor.ports import AdapterFactory


class Detour(AdapterFactory):
    def resume_store(self):
        return retry_parked_saga

    def gauges(self):
        return list_parked(self.operator_queries())
"""


def test_the_port_check_sees_a_planted_higher_layer() -> None:
    # Guards the check above against passing because it finds no port, caller or implementation.
    planted = {
        **SOURCES,
        "ports/planted.py": PLANTED_PORT,
        "runtime/planted.py": "from processor.ports.planted import Resumer\n",
        "bootstrap/planted.py": PLANTED_DETOUR,
    }
    found = port_leaks(planted)
    assert ("ports/planted.py:Resumer.resume", "ops/parked.py") in found
    assert ("bootstrap/planted.py:Detour.resume_store", "ops/parked.py") in found
    assert ("bootstrap/planted.py:Detour.gauges", "ops/parked.py") in found
    # The composition root's own implementation is seen: the old detour put back into it.
    head = "    def resume_store(self) -> OperatorQueries:\n"
    root = SOURCES["bootstrap/adapters.py"]
    assert head in root
    detour = (
        "        from processor.ops.parked import retry_parked_saga\n        retry_parked_saga\n"
    )
    back = {**SOURCES, "bootstrap/adapters.py": root.replace(head, head + detour)}
    assert ("bootstrap/adapters.py:Adapters.resume_store", "ops/parked.py") in port_leaks(back)


def test_only_the_adapters_import_the_client_libraries() -> None:
    wrong = [
        (rel, client)
        for rel, names in MODULES.items()
        for where, client in CLIENTS.items()
        if _imports(names, client) and not rel.startswith(where)
    ]
    assert wrong == []


def test_only_the_composition_root_and_test_kits_import_an_adapter() -> None:
    wrong = [
        (rel, adapter)
        for rel, names in MODULES.items()
        if not _under(rel, ADAPTER_PACKAGES) and not _under(rel, MAY_IMPORT_ADAPTERS)
        for adapter in ("processor.postgres", "processor.kafka", "processor.memory")
        if _imports(names, adapter)
    ]
    assert wrong == []


def test_adapters_do_not_import_each_other() -> None:
    wrong = [
        (rel, other)
        for rel, names in MODULES.items()
        for own in ADAPTER_PACKAGES
        if rel.startswith(own)
        for other in ADAPTER_PACKAGES
        if other != own and _imports(names, "processor." + other.rstrip("/"))
    ]
    assert wrong == []


def test_only_the_entry_points_import_the_cli() -> None:
    wrong = [
        rel
        for rel, names in MODULES.items()
        if not _under(rel, CLI_ENTRIES) and _imports(names, "processor.cli")
    ]
    assert wrong == []


def test_the_import_reader_sees_what_it_should() -> None:
    # Guards the checks above against passing because the reader finds nothing.
    assert _imports(MODULES["postgres/batch.py"], "psycopg")
    assert _imports(MODULES["kafka/client.py"], "confluent_kafka")
    assert _imports(MODULES["__main__.py"], "processor.cli")
    assert not _imports({"processor.client"}, "processor.cli")


def test_the_architecture_page_lists_the_layers_this_test_enforces() -> None:
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    rows = [
        line.split("|")[1:3]
        for line in page.splitlines()
        if line.startswith("| ") and not line.startswith("| layer") and "`" in line
    ]
    listed = tuple(
        (name.strip(), tuple(p.strip(" `") for p in paths.split(","))) for name, paths in rows
    )
    assert listed == LAYERS
