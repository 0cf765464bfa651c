"""`saga reset SAGA_TYPE SAGA_ID --before MESSAGE_ID --reason WHY [--resend]`.

Returns a saga to the state it had before one of its inputs and replays that input and the later
ones with the code running now: for a saga a handler bug sent the wrong way, once the fix is
deployed. The request is a signed operator record through the saga's own partition (see
`processor._engine.reset`); the processor refuses it, changing nothing, when the replay would send
again a command of a kind those inputs already sent, unless ``--resend`` says to. `show` lists the
message ids of a saga's inputs.
"""

from __future__ import annotations

import argparse
import json

from processor._cli.commands import json_flag
from processor._wire import OperatorAction
from processor.settings import ProcessorSettings

__all__ = ["reset", "reset_arguments"]


def reset_arguments(parser: argparse.ArgumentParser) -> None:
    """`SAGA_TYPE SAGA_ID --before MESSAGE_ID --reason WHY [--resend] [--wait S] [--json]`."""
    from processor._cli.requests import wait_arguments

    parser.add_argument("saga_type", metavar="SAGA_TYPE")
    parser.add_argument("saga_id", metavar="SAGA_ID")
    parser.add_argument(
        "--before",
        required=True,
        metavar="MESSAGE_ID",
        help="the input to go back before (its message id, as `show` lists it); it and every "
        "later input replay",
    )
    parser.add_argument(
        "--resend",
        action="store_true",
        help="let the replay send again commands of the kinds the replayed inputs already sent "
        "(refused otherwise)",
    )
    parser.add_argument("--reason", required=True)
    wait_arguments(parser)
    json_flag(parser)


def reset(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Sends the reset and waits for its outcome.

    Exit code 0 once applied; 1 when refused (no such input, a history that cannot rebuild the
    saga, a replayed input that fails, commands that would be sent again without ``--resend``);
    3 when not sent, or not applied within ``--wait`` seconds.
    """
    from processor._cli.requests import request

    options = json.dumps({"resend": bool(args.resend)})
    return request(args, settings, OperatorAction.RESET, args.before, options)
