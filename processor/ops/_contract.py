"""``saga-processor schemas MODULE...``: the AsyncAPI document of a deployment's own messages.

Importing the modules registers their messages (``@message_type``) and declares their sagas
(``@saga``); the sagas found among the modules' attributes decide which topics are consumed and
how their records are keyed. No database, broker or settings are needed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable
from pathlib import Path

from processor._authoring.asyncapi import asyncapi_document, render
from processor._authoring.definition import SagaDefinition
from processor._authoring.messages import registry
from processor._errors import ConfigurationError

__all__ = ["contract_arguments", "find_sagas", "schemas"]


def contract_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``schemas`` subcommand's arguments."""
    parser.add_argument("modules", nargs="+", help="modules registering messages and sagas")
    parser.add_argument("--output", "-o", help="file to write (default: standard output)")
    parser.add_argument("--title", default="Saga processor messages")
    parser.add_argument("--version", dest="doc_version", default="1.0.0")
    parser.add_argument("--topic-prefix", default="", help="prefix of every topic address")
    parser.add_argument("--dead-letter-topic", default="saga-dead-letters")
    parser.add_argument(
        "--json", action="store_true", help="accepted for uniformity: the document is JSON"
    )


def find_sagas(modules: Iterable[str]) -> list[SagaDefinition]:
    """Imports ``modules``; returns the sagas among their attributes, each once.

    Raises:
        ConfigurationError: A module cannot be imported.
    """
    # Like ``python -m``: the user's modules are found from the current directory too.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    found: dict[str, SagaDefinition] = {}
    problems: list[str] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            problems.append(f"cannot import {name!r}: {e}")
            continue
        for value in vars(module).values():
            definition = vars(value).get("__saga_definition__") if isinstance(value, type) else None
            if isinstance(definition, SagaDefinition):
                found.setdefault(definition.saga_type, definition)
    if problems:
        raise ConfigurationError(problems)
    return [found[k] for k in sorted(found)]


def schemas(args: argparse.Namespace) -> int:
    """Writes the AsyncAPI 3 document of every message the modules register."""
    sagas = find_sagas(args.modules)
    text = render(
        asyncapi_document(
            registry,
            sagas,
            title=args.title,
            version=args.doc_version,
            topic_prefix=args.topic_prefix,
            dead_letter_topic=args.dead_letter_topic,
        )
    )
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
