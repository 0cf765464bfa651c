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

# Paths relative to the package; a directory entry covers everything below it.
ADAPTERS = {"postgres/": "psycopg", "kafka/": "confluent_kafka"}
PURE = (
    "engine/",
    "runtime/",
    "ops/",
    "memory/",
    "machine/",
    "participant/",
    "asyncapi.py",
    "observe/",
    "ports.py",
    "wire.py",
    # The authoring core.
    "application.py",
    "__init__.py",
    "binding.py",
    "definition.py",
    "upcasting.py",
    "errors.py",
    "handles.py",
    "messages.py",
    "params.py",
    "runner.py",
    "settings.py",
    "testing.py",
    "testing_engine.py",
    # Builds the publishers' records; imports no client, unlike the publishers below.
    "publish/records.py",
)
EDGES = (
    "postgres/",
    "kafka/",
    "console/",
    "cli.py",
    "cli_commands.py",
    "cli_inspect.py",
    "cli_operate.py",
    "cli_preflight.py",
    "cli_topics.py",
    "cli_participant.py",
    "__main__.py",
    # The event publishers: wire the Kafka producer and the Postgres outbox for services.
    "publish/__init__.py",
    "publish/kafka.py",
    "publish/outbox.py",
    "publish/relay.py",
)
# Where the pure runtime is wired to the real adapters.
ASSEMBLY_POINTS = {
    "runtime/processor.py",
    "runtime/assembly.py",
    "runtime/observe.py",
    "participant/service.py",
    "participant/serve.py",
}
CLI_ENTRIES = {"cli.py", "__main__.py"}


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


def _under(rel: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)


def _imports(names: set[str], module: str) -> bool:
    return any(n == module or n.startswith(module + ".") for n in names)


MODULES = _modules()


def test_every_module_is_placed_in_a_layer() -> None:
    assert MODULES, ROOT
    unplaced = [m for m in MODULES if not _under(m, PURE) and not _under(m, EDGES)]
    assert unplaced == [], "add new modules to PURE or EDGES"


def test_only_the_adapters_import_the_client_libraries() -> None:
    wrong = [
        (rel, client)
        for rel, names in MODULES.items()
        for where, client in ADAPTERS.items()
        if _imports(names, client) and not rel.startswith(where)
    ]
    assert wrong == []


def test_pure_layers_import_no_adapter_except_at_the_assembly_points() -> None:
    wrong = [
        (rel, adapter)
        for rel, names in MODULES.items()
        if _under(rel, PURE) and rel not in ASSEMBLY_POINTS
        for adapter in ("processor.postgres", "processor.kafka")
        if _imports(names, adapter)
    ]
    assert wrong == []


def test_only_the_entry_points_import_the_cli() -> None:
    wrong = [
        rel
        for rel, names in MODULES.items()
        if rel not in CLI_ENTRIES and _imports(names, "processor.cli")
    ]
    assert wrong == []


def test_the_import_reader_sees_what_it_should() -> None:
    # Guards the checks above against passing because the reader finds nothing.
    assert _imports(MODULES["postgres/batch.py"], "psycopg")
    assert _imports(MODULES["kafka/client.py"], "confluent_kafka")
    assert _imports(MODULES["runtime/processor.py"], "processor.postgres")
    assert _imports(MODULES["__main__.py"], "processor.cli")
    assert not _imports({"processor.cli_commands"}, "processor.cli")
