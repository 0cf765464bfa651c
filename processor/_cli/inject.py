"""`saga inject SAGA_TYPE SAGA_ID MESSAGE_TYPE --json-value JSON --reason WHY`.

Delivers an event to one saga by hand (a reply its participant lost, a decision made on the
phone). The value is validated against the message type before anything is sent; the event
travels as a signed operator record through the saga's own partition (see
`processor._engine.inject`), so the processor applies it in the saga's log order, exactly as the
event's handler would have, and records who and why in the history and the audit trail.
"""

from __future__ import annotations

import argparse

from processor._cli.commands import app_of, json_flag
from processor._errors import SagaError
from processor._wire import OperatorAction
from processor.settings import ProcessorSettings

__all__ = ["inject", "inject_arguments", "injected_value"]


def inject_arguments(parser: argparse.ArgumentParser) -> None:
    """`SAGA_TYPE SAGA_ID MESSAGE_TYPE --json-value JSON --reason WHY [--wait S] [--json]`."""
    from processor._cli.requests import wait_arguments

    parser.add_argument("saga_type", metavar="SAGA_TYPE")
    parser.add_argument("saga_id", metavar="SAGA_ID")
    parser.add_argument("message_type", metavar="MESSAGE_TYPE", help="the event's wire name")
    parser.add_argument(
        "--json-value", dest="json_value", required=True, help="the event's value, as JSON"
    )
    parser.add_argument("--reason", required=True)
    wait_arguments(parser)
    json_flag(parser)


def injected_value(message_type: str, value: str) -> str:
    """``value`` as the JSON the request carries, once it validates as ``message_type``.

    Raises:
        SagaError: The type is not registered, or the value is not valid JSON or not a valid
            ``message_type`` (one line naming the fields at fault, never a value): exit 2.
    """
    from processor._authoring.messages import registry
    from processor._engine.decode import injected

    message = injected(registry, message_type, value)
    if isinstance(message, str):
        raise SagaError(f"not sent: {message}")
    # Sent as the operator wrote it (the processor validates it again): never re-encoded.
    return value.strip()


def inject(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Validates the event, sends it as an operator request and waits for the outcome.

    Exit code 0 once applied; 1 when refused (no such saga, an ended saga, an event that names
    another saga) or the saga's code failed on it; 2 for an unknown type or an invalid value
    (nothing is sent); 3 when not sent, or not applied within ``--wait`` seconds.
    """
    from processor._cli.requests import request
    from processor._runtime.assembly import load_saga_classes

    if app_of(args) is None and settings.sagas:
        load_saga_classes(settings.sagas)  # registers the sagas' message types
    value = injected_value(args.message_type, args.json_value)
    return request(args, settings, OperatorAction.INJECT, args.message_type, value)
