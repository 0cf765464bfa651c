"""The console's ASGI application: pages over the inspect queries, and guarded actions.

Pages are server-rendered (Jinja2) and work without JavaScript. Every list is paginated by key
and every query is served by an index, so pages stay fast on a database of a million sagas.
Actions exist only when the app is created with ``actions=True`` and a token; each one is a form
POST that must carry that token and a reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from processor.console.backend import Backend
from processor.errors import SagaError
from processor.ops.diagram import svg
from processor.ops.inspect import NoSuchSaga, show_saga
from processor.ops.views import jsonable, step_state
from processor.settings import parse_duration
from processor.wire import OperatorAction

__all__ = ["create_app"]

PAGE = 50
TEMPLATES = Path(__file__).parent / "templates"


def _age(value: timedelta | datetime | None) -> str:
    """A duration (or the time since a moment) as `3d 4h`, `2h 5m`, `7m 3s` or `12s`."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        value = datetime.now(value.tzinfo) - value
    s = max(int(value.total_seconds()), 0)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m"
    if s >= 60:
        return f"{s // 60}m {s % 60}s"
    return f"{s}s"


def create_app(backend: Backend, *, actions: bool = False, token: str | None = None) -> Starlette:
    """The console over ``backend``.

    Args:
        backend: Database, broker and saga classes.
        actions: Whether the action forms are shown and accepted.
        token: The secret every action must carry; actions stay off without one.
    """
    templates = Jinja2Templates(directory=str(TEMPLATES))
    templates.env.filters["age"] = _age
    templates.env.filters["pretty"] = lambda v: json.dumps(jsonable(v), indent=2, sort_keys=True)
    enabled = actions and bool(token)

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("notice", request.query_params.get("notice"))
        context["actions"] = enabled
        return templates.TemplateResponse(request, name, context, status_code=status)

    def overview(request: Request) -> Response:
        with backend.inspect() as q:
            data = q.overview()
        data = dataclasses.replace(data, lag=backend.consumer_lag())
        return render(request, "overview.html", overview=data, title="Overview")

    def sagas(request: Request) -> Response:
        p = request.query_params
        after = None
        if p.get("after"):
            at, saga_type, saga_id = p["after"].split("|", 2)
            after = (datetime.fromisoformat(at), saga_type, saga_id)
        older = parse_duration(p["older_than"]) if p.get("older_than") else None
        with backend.inspect() as q:
            rows = q.list_sagas(
                saga_type=p.get("type") or None,
                status=p.get("status") or None,
                machine_state=p.get("state") or None,
                older_than=older,
                after=after,
                limit=PAGE,
            )
        more = None
        if len(rows) == PAGE:
            last = rows[-1]
            query = {k: v for k, v in p.items() if k != "after"}
            query["after"] = f"{last.updated_at.isoformat()}|{last.saga_type}|{last.saga_id}"
            more = "/sagas?" + urlencode(query)
        return render(request, "sagas.html", rows=rows, more=more, title="Sagas", params=p)

    def stuck(request: Request) -> Response:
        p = request.query_params
        older = parse_duration(p.get("older_than") or "1h")
        with backend.inspect() as q:
            rows = q.stuck(older_than=older, saga_type=p.get("type") or None, limit=PAGE)
        return render(
            request, "sagas.html", rows=rows, more=None, title="Stuck sagas", params=p, stuck=True
        )

    def search(request: Request) -> Response:
        saga_id = (request.query_params.get("saga_id") or "").strip()
        rows = []
        if saga_id:
            with backend.inspect() as q:
                rows = q.find(saga_id)
        if len(rows) == 1:
            return RedirectResponse(f"/saga/{rows[0].saga_type}/{rows[0].saga_id}", 303)
        return render(
            request, "sagas.html", rows=rows, more=None, title=f"Search: {saga_id}", params={}
        )

    def saga(request: Request) -> Response:
        saga_type = request.path_params["saga_type"]
        saga_id = request.path_params["saga_id"]
        try:
            with backend.inspect() as q:
                view = show_saga(q, saga_type, saga_id)
        except NoSuchSaga as e:
            return render(request, "error.html", 404, message=str(e), title="Not found")
        spec = backend.machine(saga_type)
        diagram = svg(spec, view.saga.machine_state) if spec is not None else None
        return render(
            request,
            "saga.html",
            view=view,
            diagram=diagram,
            own_state=step_state(view.state),
            title=f"{saga_type} {saga_id}",
        )

    def saga_json(request: Request) -> Response:
        try:
            with backend.inspect() as q:
                view = show_saga(
                    q, request.path_params["saga_type"], request.path_params["saga_id"]
                )
        except NoSuchSaga as e:
            return JSONResponse({"error": str(e)}, 404)
        return JSONResponse(jsonable(view))

    def dead_letters(request: Request) -> Response:
        before = request.query_params.get("before")
        with backend.inspect() as q:
            rows = q.dead_letters(before=int(before) if before else None, limit=PAGE)
        more = f"/dead-letters?before={rows[-1].id}" if len(rows) == PAGE else None
        return render(request, "dead_letters.html", rows=rows, more=more, title="Dead letters")

    def dead_letter(request: Request) -> Response:
        try:
            with backend.inspect() as q:
                row, _, _ = q.dead_letter(int(request.path_params["row_id"]))
        except LookupError as e:
            return render(request, "error.html", 404, message=str(e), title="Not found")
        return render(request, "dead_letter.html", row=row, title=f"Dead letter {row.id}")

    def failed_outbox(request: Request) -> Response:
        rows = backend.failed_outbox(limit=200)
        return render(request, "failed_outbox.html", rows=rows, title="Failed outbox")

    # -- actions -------------------------------------------------------------------------------

    async def _form(request: Request) -> tuple[dict[str, str], Response | None]:
        form = {k: str(v) for k, v in (await request.form()).items()}
        if not enabled or token is None:
            return form, Response("actions are disabled", 403)
        if not hmac.compare_digest(form.get("token", "").encode(), token.encode()):
            return form, Response("wrong token", 403)
        if not form.get("reason", "").strip():
            return form, Response("a reason is required", 400)
        return form, None

    async def saga_action(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        form, refused = await _form(request)
        if refused is not None:
            return refused
        saga_type = request.path_params["saga_type"]
        saga_id = request.path_params["saga_id"]
        action = request.path_params["action"]
        reason = form["reason"]
        try:
            if action == "terminate" and form.get("force") != "yes":
                raise SagaError(
                    "terminate undoes nothing; tick the box to confirm, or cancel instead"
                )
            if action in ("retry", "skip", "cancel", "terminate", "resolve"):
                op = {
                    "retry": OperatorAction.PARKED_RETRY,
                    "skip": OperatorAction.PARKED_SKIP,
                    "cancel": OperatorAction.CANCEL,
                    "terminate": OperatorAction.TERMINATE,
                    "resolve": OperatorAction.RESOLVE,
                }[action]
                decision = form.get("decision") if action == "resolve" else None
                entry, status = await run_in_threadpool(
                    backend.act, op, saga_type, saga_id, reason, decision or None
                )
                notice = (
                    f"{action} sent; no processor applied it yet (see the timeline)"
                    if entry is None
                    else f"{action} {entry.outcome}, now {status}"
                    if entry.outcome == "applied"
                    else f"{action} {entry.outcome}: {entry.detail or ''}"
                )
            else:
                op = {
                    "fire-now": OperatorAction.DEADLINE_FIRE_NOW,
                    "cancel-deadline": OperatorAction.DEADLINE_CANCEL,
                }[action]
                mid = await run_in_threadpool(
                    backend.request, op, saga_type, saga_id, reason, form.get("name") or None
                )
                notice = f"{action} sent as {mid}; it shows in the timeline once applied"
        except (SagaError, KeyError) as e:
            notice = f"{action} refused: {e}"
        query = urlencode({"notice": notice})
        return RedirectResponse(f"/saga/{saga_type}/{saga_id}?{query}", 303)

    async def dead_letter_action(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        _, refused = await _form(request)
        if refused is not None:
            return refused
        row_id = int(request.path_params["row_id"])
        action = request.path_params["action"]
        try:
            if action == "replay":
                await run_in_threadpool(backend.replay_dead_letter, row_id)
            else:
                await run_in_threadpool(backend.purge_dead_letter, row_id)
            notice = f"dead letter {row_id}: {action} done"
        except SagaError as e:
            notice = f"{action} refused: {e}"
        return RedirectResponse("/dead-letters?" + urlencode({"notice": notice}), 303)

    async def outbox_action(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        form, refused = await _form(request)
        if refused is not None:
            return refused
        row_id = int(request.path_params["row_id"])
        retry = request.path_params["action"] == "retry"
        try:
            rows = await run_in_threadpool(backend.outbox_action, row_id, retry, form["reason"])
            notice = f"{len(rows)} rows {'put back' if retry else 'discarded'}"
        except SagaError as e:
            notice = f"refused: {e}"
        return RedirectResponse("/failed-outbox?" + urlencode({"notice": notice}), 303)

    routes = [
        Route("/", overview),
        Route("/sagas", sagas),
        Route("/stuck", stuck),
        Route("/search", search),
        Route("/saga/{saga_type}/{saga_id}", saga),
        Route("/api/saga/{saga_type}/{saga_id}", saga_json),
        Route("/saga/{saga_type}/{saga_id}/{action}", saga_action, methods=["POST"]),
        Route("/dead-letters", dead_letters),
        Route("/dead-letters/{row_id:int}", dead_letter),
        Route("/dead-letters/{row_id:int}/{action}", dead_letter_action, methods=["POST"]),
        Route("/failed-outbox", failed_outbox),
        Route("/failed-outbox/{row_id:int}/{action}", outbox_action, methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        backend.close()

    return Starlette(routes=routes, lifespan=lifespan)
