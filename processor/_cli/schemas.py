"""`saga-processor schemas`: the models' schemas, as AsyncAPI or in the Schema Registry.

`schemas MODULE...` writes the AsyncAPI document of the modules' messages and sagas
(:mod:`processor.ops._contract`); it reads only its arguments.

`register` registers each message type's schema for every topic set to a registry format
(`SAGA_SCHEMA_REGISTRY__TOPICS`) under the configured subject naming; `check` asks the registry
whether each would be accepted and registers nothing, so a CI step can refuse a deploy whose
models the registry would refuse. Exit codes: 0; 1 when a schema is refused or cannot be made;
3 when the registry did not answer.
"""

from __future__ import annotations

import argparse
import os
import sys

from processor._cli.commands import emit
from processor._cli.inspect import EXIT_NOT_SENT
from processor._errors import Retryable
from processor.ops import _contract as contract
from processor.settings import ProcessorSettings, load_settings

ACTIONS = ("register", "check")

# Stands in for the database URL, which these commands never dial (see cli.main).
_UNUSED_DATABASE = "postgresql://unused.invalid/unused"


def schemas_arguments(parser: argparse.ArgumentParser) -> None:
    """`register`, `check`, or the modules of the AsyncAPI document and its options."""
    contract.contract_arguments(parser)
    parser.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        default=None,
        help="with register or check: the application object (default: SAGA_APP)",
    )


def schemas(args: argparse.Namespace) -> int:
    """`register` or `check` against the registry; else the AsyncAPI document of the modules."""
    if args.modules[0] not in ACTIONS:
        return contract.schemas(args)
    if len(args.modules) > 1:
        print(f"saga-processor: schemas {args.modules[0]} takes no modules", file=sys.stderr)
        return 2
    args.action = args.modules[0]
    from processor._authoring.application import app_target, load_app

    target = app_target(args.app)
    app = load_app(target) if target else None
    args.saga_app = app
    defaults = dict(app.settings) if app is not None else {}
    if "SAGA_DATABASE__URL" not in os.environ:
        defaults.setdefault("database", {"url": _UNUSED_DATABASE})
    return registry_schemas(args, load_settings(defaults=defaults))


def registry_schemas(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Registers or checks the models' schemas; returns the exit code."""
    from processor._authoring.messages import registry
    from processor._bootstrap.schemas import registry_client
    from processor._cli.commands import app_of
    from processor._runtime.assembly import bind_sagas, open_sagas
    from processor._schemas.plan import plan_schemas
    from processor.ops._schemas import check_schemas, register_schemas

    sr = settings.schema_registry
    formats = sr.formats(settings.topic_prefix)
    if not formats:
        emit(args, {"ok": True, "schemas": []}, "no topic is set to a registry format")
        return 0
    app = app_of(args)
    types = registry
    if app is None or hasattr(app, "sagas"):
        # The sagas' modules register their messages (a participant's app has done so already).
        with open_sagas(settings, app) as (saga_classes, dependencies):
            types = bind_sagas(settings, saga_classes, dependencies=dependencies).registry
    plans = plan_schemas(types, formats, sr.subject_naming, settings.topic_prefix)
    client = registry_client(sr)
    try:
        act = register_schemas if args.action == "register" else check_schemas
        verdicts = act(client, plans)
    except Retryable as e:
        print(f"saga-processor: {e}", file=sys.stderr)
        return EXIT_NOT_SENT
    finally:
        client.close()
    rows = [
        {
            "topic": v.plan.topic,
            "message_type": v.plan.mtype.name,
            "version": v.plan.mtype.version,
            "subject": v.plan.writer.subject if v.plan.writer else None,
            "format": v.plan.writer.format.value if v.plan.writer else None,
            "outcome": v.outcome,
            "schema_id": v.schema_id,
            "detail": v.detail,
        }
        for v in verdicts
    ]
    ok = all(v.ok for v in verdicts)
    lines = [
        f"{r['outcome']:<12} {r['subject'] or r['topic']}  {r['message_type']} v{r['version']}"
        + (f"  id {r['schema_id']}" if r["schema_id"] is not None else "")
        + (f"  ({r['detail']})" if r["detail"] else "")
        for r in rows
    ]
    lines.append(f"{len(rows)} schemas: {'ok' if ok else 'REFUSED'}")
    emit(args, {"ok": ok, "schemas": rows}, "\n".join(lines))
    return 0 if ok else 1
