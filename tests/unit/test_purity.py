"""Layering: who may import the Kafka and PostgreSQL clients, their adapters, and the CLI.

The authoring API, the examples and the schemas import no client at all (checked by importing
them); inside ``processor`` every module's import statements are read with ``ast``, so an
import inside a function or under ``TYPE_CHECKING`` counts as much as one at the top.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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


def _modules() -> dict[str, set[str]]:
    """Every module of the package (path relative to it) and the names of all it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        package = ["processor", *rel.split("/")[:-1]]
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
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


def _target(name: str, modules: dict[str, set[str]]) -> str | None:
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
    planted["postgres/batch.py"].add("processor.ops.parked.resume_too_new")
    found = upward_imports(planted)
    assert ("engine/plan.py", "runtime/worker.py") in found
    assert ("postgres/batch.py", "ops/parked.py") in found


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
