"""Layering: who may import the Kafka and PostgreSQL clients, their adapters, and the CLI.

The authoring API, the examples and the schemas import no client at all (checked by importing
them), and the examples and schemas import no internal module of the processor; inside
``processor`` every module's import statements are read with ``ast``, so an import inside a
function or under ``TYPE_CHECKING`` counts as much as one at the top.
"""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import processor

ROOT = Path(processor.__file__).parent

# Every module of the authoring package, the public facades over it, the test kits, and the
# examples: none may load a client library.
CHECK = """
import importlib, pkgutil, sys
import processor, processor._authoring, processor._invocation, processor.testing, sagas, schemas
import processor.participant, processor.settings, processor._memory.participant, schemas.export
import demo.orders
for m in pkgutil.walk_packages(processor._authoring.__path__, 'processor._authoring.'):
    importlib.import_module(m.name)
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
    assert processor.message_registry is processor._authoring.messages.registry


# -- imports inside the package ---------------------------------------------------------------

# The layers, lowest first: a module imports only from its own layer or a lower one, so an
# upward import anywhere fails `test_no_module_imports_from_a_higher_layer`. Paths are relative
# to the package; a directory entry covers everything below it. docs/architecture.md explains
# each layer.
# The most specific entry places a module: `_authoring/` is authoring but for its participant
# kit and application, which build on the ports and settings; `ops/` is the operator services
# but for its package, which offers the composition root's adapters to Python callers.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("_errors.py", "_wire.py")),
    ("authoring", ("_authoring/", "_invocation/")),
    ("engine", ("_engine/", "_schemas/")),
    ("ports", ("_ports/",)),
    ("application", ("_authoring/participant/", "_authoring/application.py", "settings/")),
    ("adapters", ("_memory/", "_postgres/", "_kafka/")),
    ("observe", ("_observe/",)),
    ("runtime", ("_runtime/",)),
    ("ops", ("ops/",)),
    ("composition", ("_bootstrap/",)),
    (
        "entry points",
        (
            "_cli/",
            "_console/",
            "testing/",
            "publish/",
            "participant/",
            "ops/__init__.py",
            "__main__.py",
            "__init__.py",
            "_compat.py",
        ),
    ),
)
CLIENTS = {"_postgres/": "psycopg", "_kafka/": "confluent_kafka"}
ADAPTER_PACKAGES = ("_memory/", "_postgres/", "_kafka/")
# Who may name an adapter: the composition root builds every one; the test kits run the saga
# and participant fixtures over the in-memory ones.
MAY_IMPORT_ADAPTERS = ("_bootstrap/", "testing/")
CLI_ENTRIES = ("_cli/", "__main__.py")


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
    """The layer of the most specific entry of :data:`LAYERS` that covers ``rel``."""
    found = [(len(p), i) for i, (_, paths) in enumerate(LAYERS) for p in paths if _under(rel, (p,))]
    return max(found)[1] if found else None


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
    planted["_engine/plan.py"].add("processor._runtime.consumer.worker")
    planted["_postgres/batch/handle.py"].add("processor.ops._parked.retry_parked_saga")
    # The participant kit is application, not authoring: the messages may not use it.
    planted["_authoring/messages.py"].add("processor._authoring.participant.kit.CommandKit")
    # The operator services' package offers the composition root; the services may not use it.
    planted["ops/_parked.py"].add("processor._bootstrap.adapters.Adapters")
    found = upward_imports(planted)
    assert ("_engine/plan.py", "_runtime/consumer/worker.py") in found
    assert ("_postgres/batch/handle.py", "ops/_parked.py") in found
    assert ("_authoring/messages.py", "_authoring/participant/kit.py") in found
    assert ("ops/_parked.py", "_bootstrap/adapters.py") in found


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
        for c in tree.body if rel.startswith("_ports/") else []:
            if isinstance(c, ast.ClassDef) and "Protocol" in {
                _dotted(b.value if isinstance(b, ast.Subscript) else b) for b in c.bases
            }:
                ports[c.name] = (rel, c, _methods(c))

    def inherited(c: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        bases = [ports[b][1] for b in map(_dotted, c.bases) if b in ports]
        return {k: f for base in bases for k, f in inherited(base).items()} | _methods(c)

    ports = {name: (rel, c, inherited(c)) for name, (rel, c, _) in ports.items()}
    # Every class outside the ports, found once: walking every tree again for each port took
    # nine tenths of the check's time.
    classes = [
        (rel, c)
        for rel, tree in trees.items()
        if not rel.startswith("_ports/")
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef)
    ]
    leaks: set[tuple[str, str]] = set()
    for name, (port_rel, _, methods) in ports.items():
        implementations = [
            (rel, c)
            for rel, c in classes
            if (
                any(bindings[rel].get(str(_dotted(b)), "").endswith("." + name) for b in c.bases)
                # By shape too, when the port has more than a name in common with a class.
                or (len(methods) > 1 and set(methods) <= set(_methods(c)))
            )
        ]
        callers = [
            layer
            for rel, bound in bindings.items()
            if not rel.startswith("_ports/")
            if any(
                t.startswith("processor._ports") and t.endswith("." + name) for t in bound.values()
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

from processor.ops._parked import RetryResult


class Resumer(Protocol):
    def resume(self) -> Callable[[], list[RetryResult]]: ...
"""
# The detour this check was written for: the factory port's implementation handing the runtime
# (its caller) a function of ops/, or running one for it.
PLANTED_DETOUR = """
from processor.ops._parked import list_parked, retry_parked_saga
from processor._ports import AdapterFactory


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
        "_ports/planted.py": PLANTED_PORT,
        "_runtime/planted.py": "from processor._ports.planted import Resumer\n",
        "_bootstrap/planted.py": PLANTED_DETOUR,
    }
    found = port_leaks(planted)
    assert ("_ports/planted.py:Resumer.resume", "ops/_parked.py") in found
    assert ("_bootstrap/planted.py:Detour.resume_store", "ops/_parked.py") in found
    assert ("_bootstrap/planted.py:Detour.gauges", "ops/_parked.py") in found
    # The composition root's own implementation is seen: the old detour put back into it.
    head = "    def resume_store(self) -> OperatorQueries:\n"
    root = SOURCES["_bootstrap/adapters.py"]
    assert head in root
    detour = (
        "        from processor.ops._parked import retry_parked_saga\n        retry_parked_saga\n"
    )
    back = {**SOURCES, "_bootstrap/adapters.py": root.replace(head, head + detour)}
    assert ("_bootstrap/adapters.py:Adapters.resume_store", "ops/_parked.py") in port_leaks(back)


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
        for adapter in ("processor._postgres", "processor._kafka", "processor._memory")
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
        if not _under(rel, CLI_ENTRIES) and _imports(names, "processor._cli")
    ]
    assert wrong == []


def test_the_import_reader_sees_what_it_should() -> None:
    # Guards the checks above against passing because the reader finds nothing.
    assert _imports(MODULES["_postgres/batch/handle.py"], "psycopg")
    assert _imports(MODULES["_kafka/client.py"], "confluent_kafka")
    assert _imports(MODULES["__main__.py"], "processor._cli")
    assert not _imports({"processor._client"}, "processor._cli")


# -- the public surface -----------------------------------------------------------------------

# What saga and participant authors import: the authoring package and the two facades over it.
# They load no client (the subprocess check above) and name nothing that runs, stores or
# serves; the facades alone may name the composition root, loaded on first use of a name.
AUTHORING_SURFACE = ("_authoring/", "__init__.py", "participant/__init__.py")
NOT_FOR_AUTHORS = (
    "psycopg",
    "confluent_kafka",
    "processor._postgres",
    "processor._kafka",
    "processor._memory",
    "processor._runtime",
    "processor._observe",
    "processor._cli",
    "processor._console",
)
NOT_FOR_THE_AUTHORING_PACKAGE = ("processor._bootstrap", "processor.ops", "processor.publish")
# The packages users import; every other module's path has a component with a leading "_".
PUBLIC_PACKAGES = tuple(
    f"{p}__init__.py" for p in ("", "participant/", "publish/", "testing/", "ops/", "settings/")
)
# What a public package's __init__ may import beside the processor's own modules.
FACADE_STANDARD = ("__future__", "typing", "importlib", "warnings")


def authoring_leaks(modules: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) for each import of the authoring surface it may not make."""
    return sorted(
        (rel, name)
        for rel, names in modules.items()
        if _under(rel, AUTHORING_SURFACE)
        for name in names
        for banned in NOT_FOR_AUTHORS
        + (NOT_FOR_THE_AUTHORING_PACKAGE if rel.startswith("_authoring/") else ())
        if _imports({name}, banned)
    )


def test_the_authoring_package_and_its_facades_name_no_client_or_adapter() -> None:
    assert authoring_leaks(MODULES) == []


def test_the_authoring_check_sees_a_planted_adapter() -> None:
    planted = {rel: set(names) for rel, names in MODULES.items()}
    planted["_authoring/messages.py"].add("processor._postgres.connect")
    planted["participant/__init__.py"].add("psycopg")
    planted["_authoring/orchestration/saga.py"].add("processor._bootstrap.adapters")
    assert authoring_leaks(planted) == [
        ("_authoring/messages.py", "processor._postgres.connect"),
        ("_authoring/orchestration/saga.py", "processor._bootstrap.adapters"),
        ("participant/__init__.py", "psycopg"),
    ]


def facade_imports(modules: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """(public package, import) for each import of a public ``__init__`` outside the package.

    A public package offers the processor's own names: a third-party library in its
    ``__init__`` would load for every user of it, needed or not.
    """
    return sorted(
        (rel, name)
        for rel in PUBLIC_PACKAGES
        for name in modules[rel]
        if name.split(".")[0] != "processor" and name.split(".")[0] not in FACADE_STANDARD
    )


def test_the_public_packages_import_only_the_processor() -> None:
    assert set(PUBLIC_PACKAGES) <= set(MODULES)
    assert facade_imports(MODULES) == []
    # Placed in the layers like every module (test_every_module_is_placed_in_a_layer), they
    # sit above what they offer: the layer check holds for them too.
    assert all(_layer(rel) is not None for rel in PUBLIC_PACKAGES)


def test_the_facade_check_sees_a_planted_library() -> None:
    planted = {rel: set(names) for rel, names in MODULES.items()}
    planted["ops/__init__.py"].add("psycopg.sql")
    planted["publish/__init__.py"].add("confluent_kafka")
    assert facade_imports(planted) == [
        ("ops/__init__.py", "psycopg.sql"),
        ("publish/__init__.py", "confluent_kafka"),
    ]


# The example sagas, their schemas and the demo are written as users write theirs: from the
# public packages only.
EXAMPLES = ("sagas", "schemas", "demo")


def private_imports(root: Path) -> list[tuple[str, str]]:
    """(file, module) for each import below ``root`` of a processor module that is internal."""
    found: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=where)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from processor import _wire` names an internal module as much as the path.
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            found += [
                (where, n)
                for n in names
                if n.split(".")[0] == "processor"
                and any(part.startswith("_") for part in n.split(".")[1:])
            ]
    return found


@pytest.mark.parametrize("package", EXAMPLES)
def test_the_examples_import_only_public_modules(package: str) -> None:
    assert private_imports(ROOT.parent / package) == []


def test_the_example_check_sees_a_planted_private_import(tmp_path: Path) -> None:
    copy = tmp_path / "sagas"
    copy.mkdir()
    for path in (ROOT.parent / "sagas").glob("*.py"):
        (copy / path.name).write_text(path.read_text())
    order = copy / "order.py"
    order.write_text(order.read_text() + "\nfrom processor._wire import HEADER_MESSAGE_ID\n")
    (copy / "trip.py").write_text(
        (copy / "trip.py").read_text() + "\n\ndef f() -> None:\n    from processor import _errors\n"
    )
    assert private_imports(copy) == [
        ("order.py", "processor._wire.HEADER_MESSAGE_ID"),
        ("trip.py", "processor._errors"),
    ]


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
