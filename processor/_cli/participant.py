"""`saga-processor participant run|migrate MODULE:ATTR`: a participant service's commands."""

from __future__ import annotations

import argparse
import json

from processor._authoring.application import ParticipantApp
from processor._errors import SagaError
from processor.settings import ProcessorSettings

__all__ = ["participant", "participant_arguments"]


def participant_arguments(parser: argparse.ArgumentParser) -> None:
    """`participant run|migrate [MODULE:ATTR]`."""
    parser.add_argument(
        "action",
        choices=["run", "migrate"],
        help="run: consume commands and relay replies until SIGTERM; migrate: create or upgrade "
        "the participant's tables, then exit",
    )
    parser.add_argument(
        "target",
        nargs="?",
        metavar="MODULE:ATTR",
        help="the ParticipantApp (default: --app or SAGA_APP)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with migrate: print one JSON document (run serves until stopped: its log is its "
        "output)",
    )


def participant(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Runs or migrates the participant service the app names (see processor._bootstrap)."""
    from processor._bootstrap import participant as serve

    app = args.saga_app
    if args.action == "migrate":
        applied = serve.migrate(settings, app if isinstance(app, ParticipantApp) else None)
        if args.json:
            done = {"schema": settings.participant.schema_name, "applied": applied}
            print(json.dumps(done, indent=2, sort_keys=True))
        return 0
    if args.json:
        raise SagaError("--json applies to `participant migrate`; `participant run` logs")
    if not isinstance(app, ParticipantApp):
        raise SagaError(
            "name the participant app: saga-processor participant run MODULE:ATTR (or SAGA_APP)"
        )
    return serve.run_participant(settings, app)
