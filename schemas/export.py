"""Write one JSON Schema file per registered message type.

Usage: ``python -m schemas.export [DIRECTORY]`` (default ``schemas/json``). Files are named
``<name>.v<version>.json`` and carry the wire name, version and default topic, so a producer in
any language can build a valid message with the right headers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import schemas  # noqa: F401  (imported for its side effect: registering the message types)
from processor import MessageRegistry
from processor import message_registry as registry

__all__ = ["export", "main"]

DEFAULT_DIRECTORY = Path("schemas/json")


def export(directory: Path, registry: MessageRegistry = registry) -> list[Path]:
    """Write the schema of every message type in ``registry`` to ``directory``.

    Args:
        directory: Target directory; created when missing.
        registry: Registry to export.

    Returns:
        The written paths, sorted.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in registry.all():
        document = entry.cls.model_json_schema(mode="validation")
        document["$id"] = f"{entry.name}.v{entry.version}"
        document["x-message-type"] = entry.name
        document["x-schema-version"] = entry.version
        if entry.topic is not None:
            document["x-default-topic"] = entry.topic
        path = directory / f"{entry.name}.v{entry.version}.json"
        # Sorted keys and a trailing newline keep regenerated files diff-free.
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return sorted(written)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m schemas.export``."""
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else DEFAULT_DIRECTORY
    for path in export(directory):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
