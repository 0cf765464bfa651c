"""The console's ASGI application: pages over the inspect queries, and guarded actions.

Pages are server-rendered (Jinja2) and work without JavaScript. Every list is paginated by key
and every query is served by an index, so pages stay fast on a database of a million sagas.
Actions exist only when the app is created with ``actions=True`` and someone can sign in (a
proxy, operator keys or the shared token: see :mod:`processor._console.auth`); each one is a form
POST with a reason and the page's form token, from the console's own origin, by an identity
whose role allows it, and records that identity as "by". A page shows an action's form only to
an identity whose role allows it (someone not signed in gets a link to sign in); a script may
still send a key with the POST. :mod:`processor._console.protect` holds the defences every
request passes (security headers, origin and parameter checks, throttling);
:mod:`processor._console.outage` answers 503 while the database is out of reach.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from processor._console.actions import Guard, action_routes
from processor._console.auth import COOKIE, Authenticator, Identity
from processor._console.backend import Backend
from processor._console.batch import batch_routes
from processor._console.outage import Unreachable
from processor._console.protect import FormTokens, Keys, Shield, Throttle, row_id
from processor._console.query import OUTCOMES, REFRESH_CHOICES, duration, list_filters
from processor._errors import SagaError
from processor._ports.views import FunctionJournal, jsonable, step_state
from processor._wire import HEADER_OPERATOR_AUTH
from processor.ops._diagram import svg
from processor.ops._filters import age_text, cursor
from processor.ops._inspect import NoSuchSaga, show_saga

__all__ = ["create_app"]

log = logging.getLogger(__name__)

PAGE = 50
# A header that authorises whoever holds it: shown to nobody, only that it was there.
_SECRET_HEADERS = frozenset({HEADER_OPERATOR_AUTH})
TEMPLATES = Path(__file__).parent / "templates"


def _age(value: timedelta | datetime | None) -> str:
    """A duration (or the time since a moment) as `3d 4h`, `2h 5m`, `7m 3s` or `12s`."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        value = datetime.now(value.tzinfo) - value
    return age_text(value.total_seconds())


def create_app(
    backend: Backend,
    *,
    actions: bool = False,
    token: str | None = None,
    auth: Authenticator | None = None,
    show_payloads: bool = False,
    token_name: str | None = None,
    throttle: Throttle | None = None,
) -> Starlette:
    """The console over ``backend``.

    Args:
        backend: Database, broker and saga classes.
        actions: Whether the action forms are shown and accepted.
        token: A key shared by everyone: signing in with it (or sending it with an action) makes
            an admin named ``token_name``.
        auth: Who may sign in and how; by default only the shared token, anyone reads.
        show_payloads: Whether viewers see state, payloads and dead-letter values.
        token_name: The name recorded for actions done with the shared token (by default the
            backend's operator name).
        throttle: Slows down wrong keys, per address and per name (a default one otherwise).
    """
    token_name = token_name or backend.by
    templates = Jinja2Templates(directory=str(TEMPLATES))
    templates.env.filters["age"] = _age
    templates.env.filters["pretty"] = lambda v: json.dumps(jsonable(v), indent=2, sort_keys=True)
    templates.env.globals.update(saga_outcomes=OUTCOMES, refresh_choices=REFRESH_CHOICES)
    keys: dict[str, tuple[str, Any]] = {token_name: (token, "admin")} if token else {}
    auth = auth or Authenticator(keys=keys)
    if token and auth is not None and auth.sign_in(token_name, token) is None:
        auth = _with_token(auth, token_name, token)
    enabled = actions and auth.authenticates
    throttle = throttle or Throttle()
    forms = FormTokens()

    def peer(request: Request) -> str | None:
        return request.client.host if request.client is not None else None

    def who(request: Request) -> Identity:
        return auth.identify(request.headers.items(), peer(request), request.cookies.get(COOKIE))

    def form_token(request: Request) -> str:
        return forms.token(request.state.form_cookie, request.cookies.get(COOKIE))

    def secure(request: Request) -> bool:
        return auth.over_tls(request.url.scheme, request.headers.items(), peer(request))

    checks = Keys(auth, throttle, forms, lambda r: auth.client_address(r.headers.items(), peer(r)))

    def sees_payloads(identity: Identity) -> bool:
        return show_payloads or identity.may("operator")

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("notice", request.query_params.get("notice"))
        identity = context.setdefault("identity", who(request))
        signed_in = identity.name is not None
        # Forms only for the roles that may use them; someone not signed in who could sign in
        # with a key is pointed there instead (no page asks for a key with an action).
        context["actions"] = enabled and identity.may("operator")
        context["admin"] = enabled and identity.may("admin")
        context["signed_in"] = signed_in
        context["can_sign_in"] = auth.authenticates
        context["sign_in_to_act"] = (
            enabled and not signed_in and not context["actions"] and auth.takes_keys
        )
        context["csp_nonce"] = request.state.csp_nonce
        context["form_token"] = form_token(request)
        return templates.TemplateResponse(request, name, context, status_code=status)

    def bad(request: Request, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, 400)
        return render(request, "error.html", 400, message=message, title="Bad request")

    def login_page(request: Request) -> Response:
        return render(request, "login.html", title="Sign in")

    async def login(request: Request) -> Response:
        form, refused = await checks.form(request)
        if refused is not None:
            return refused
        name = form.get("name", "").strip()
        identity, refused = checks.sign_in(request, name, form.get("key", ""))
        if refused is not None:
            return refused
        if identity is None:
            return render(request, "login.html", 403, title="Sign in", failed=True)
        response = RedirectResponse("/", 303)
        response.set_cookie(
            COOKIE,
            auth.start_session(identity),
            httponly=True,
            samesite="strict",
            max_age=12 * 3600,
            secure=secure(request),
        )
        return response

    async def logout(request: Request) -> Response:
        _, refused = await checks.form(request)
        if refused is not None:
            return refused
        auth.end_session(request.cookies.get(COOKIE))
        response = RedirectResponse("/", 303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=secure(request))
        return response

    def overview(request: Request) -> Response:
        with backend.inspect() as q:
            data = q.overview()
        data = dataclasses.replace(data, lag=backend.consumer_lag())
        return render(request, "overview.html", overview=data, title="Overview")

    def sagas(request: Request) -> Response:
        p = request.query_params

        def refuse(status: int, notice: str) -> Response:
            page: dict[str, Any] = {"rows": [], "more": None, "title": "Sagas", "notice": notice}
            return render(request, "sagas.html", status, params=p, **page)

        try:
            filters = list_filters(p)
        except SagaError as e:
            return refuse(400, str(e))
        # Matching on the state shows what it holds: only to those who may read it.
        if filters["state_contains"] and not sees_payloads(who(request)):
            return refuse(403, "searching the saga state needs the operator role")
        with backend.inspect() as q:
            rows = q.list_sagas(**filters, limit=PAGE)
        more = None
        if len(rows) == PAGE:
            last = rows[-1]
            query = {k: v for k, v in p.items() if k != "after"}
            query["after"] = cursor(last)
            more = "/sagas?" + urlencode(query)
        page: dict[str, Any] = {"rows": rows, "more": more, "title": "Sagas", "params": p}
        return render(request, "sagas.html", listing=True, **page)

    def stuck(request: Request) -> Response:
        p = request.query_params
        try:
            older = duration("older_than", p.get("older_than") or "1h")
        except SagaError as e:
            return bad(request, str(e))
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
            found = rows[0]
            page = f"/saga/{quote(found.saga_type, safe='')}/{quote(found.saga_id, safe='')}"
            return RedirectResponse(page, 303)
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
        own = step_state(view.state)
        diagram = svg(spec, view.saga.machine_state, own) if spec is not None else None
        identity = who(request)
        view = _redacted(view) if not sees_payloads(identity) else _unsigned(view)
        return render(
            request,
            "saga.html",
            identity=identity,
            hidden=not sees_payloads(identity),
            view=view,
            diagram=diagram,
            own_state=own,
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
        view = _redacted(view) if not sees_payloads(who(request)) else _unsigned(view)
        return JSONResponse(jsonable(view))

    def dead_letters(request: Request) -> Response:
        try:
            before = row_id("before", request.query_params.get("before") or None)
        except SagaError as e:
            return bad(request, str(e))
        with backend.inspect() as q:
            rows = q.dead_letters(before=before, limit=PAGE)
        more = f"/dead-letters?before={rows[-1].id}" if len(rows) == PAGE else None
        return render(request, "dead_letters.html", rows=rows, more=more, title="Dead letters")

    def dead_letter(request: Request) -> Response:
        try:
            wanted = row_id("row id", str(request.path_params["row_id"]))
            with backend.inspect() as q:
                row, _, _ = q.dead_letter(wanted or 0)
        except SagaError as e:
            return bad(request, str(e))
        except LookupError as e:
            return render(request, "error.html", 404, message=str(e), title="Not found")
        row = dataclasses.replace(row, headers=_masked(row.headers))
        identity = who(request)
        return render(
            request,
            "dead_letter.html",
            identity=identity,
            hidden=not sees_payloads(identity),
            row=row,
            title=f"Dead letter {row.id}",
        )

    def audit(request: Request) -> Response:
        batch = request.query_params.get("batch") or None
        rows = backend.audit(limit=1000 if batch else 200, batch=batch)
        return render(request, "audit.html", rows=rows, batch=batch, title="Operator actions")

    def failed_outbox(request: Request) -> Response:
        rows = backend.failed_outbox(limit=200)
        return render(request, "failed_outbox.html", rows=rows, title="Failed outbox")

    routes = [
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview),
        Route("/sagas", sagas),
        Route("/stuck", stuck),
        Route("/search", search),
        Route("/saga/{saga_type}/{saga_id}", saga),
        Route("/api/saga/{saga_type}/{saga_id}", saga_json),
        Route("/dead-letters", dead_letters),
        Route("/dead-letters/{row_id:int}", dead_letter),
        Route("/failed-outbox", failed_outbox),
        Route("/audit", audit),
        *_cluster_routes(backend, render),
        *action_routes(backend, guard := Guard(checks, who, enabled, token_name)),
        *batch_routes(backend, guard, render),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        backend.close()

    class SignedInOnly(BaseHTTPMiddleware):
        """Sends a request nobody signed to the sign-in page when anonymous reading is off."""

        async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
            open_paths = ("/login", "/logout", "/healthz", "/readyz")
            if request.url.path not in open_paths and who(request).role is None:
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": "sign in first"}, 401)
                return RedirectResponse("/login", 303)
            return await call_next(request)

    def tls(scope: Any) -> bool:
        return secure(Request(scope))

    def own_host(scope: Any) -> str:
        # Behind a trusted proxy the browser addressed the proxy: its forwarded host, if it
        # says one, is the origin's.
        request = Request(scope)
        forwarded = request.headers.get("x-forwarded-host")
        if forwarded and auth.from_proxy(request.headers.items(), peer(request)):
            return forwarded.split(",")[-1].strip()
        return request.headers.get("host", "")

    middleware = [Middleware(Shield, secure=tls, host=own_host)]
    if not auth.open_to_anyone:
        middleware.append(Middleware(SignedInOnly))
    middleware.append(Middleware(Unreachable))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)


def _with_token(auth: Authenticator, name: str, token: str) -> Authenticator:
    """``auth`` also accepting the shared token, as an admin named ``name``."""
    auth.add_key(name, token, "admin")
    return auth


def _masked(headers: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``headers`` with the value of each one that authorises something hidden."""
    if headers is None:
        return None
    return {k: "(hidden)" if k.lower() in _SECRET_HEADERS else v for k, v in headers.items()}


def _unsigned(view: Any) -> Any:
    """A saga view whose timeline hides the values of headers that authorise something."""
    timeline = [dataclasses.replace(t, headers=_masked(t.headers)) for t in view.timeline]
    return dataclasses.replace(view, timeline=timeline)


def _redacted(view: Any) -> Any:
    """A saga view without its state, payloads, headers and held or failed values."""
    timeline = [dataclasses.replace(t, payload=None, headers=None) for t in view.timeline]
    # A deadline's payload and a participant's failure reason are the saga's data too.
    deadlines = [dataclasses.replace(d, payload=None) for d in view.deadlines]
    step = dataclasses.replace(view.step, last_failure=None) if view.step else None
    return dataclasses.replace(
        view,
        state=None,
        timeline=timeline,
        deadlines=deadlines,
        step=step,
        journal=_journal_redacted(view.journal),
    )


def _journal_redacted(journal: FunctionJournal | None) -> FunctionJournal | None:
    """A saga function's journal without the texts that may quote a reply.

    Why it aborted, and why a person is asked, may carry a participant's words; the rows name
    messages only, as the timeline's do.
    """
    if journal is None:
        return None
    pending = journal.pending and dataclasses.replace(journal.pending, reason=None)
    return dataclasses.replace(journal, aborted=None, pending=pending)


# -- the cluster page and the probes ---------------------------------------------------------


def _cluster_routes(backend: Backend, render: Callable[..., Response]) -> list[Route]:
    """The cluster page and the probes; all read-only."""

    def cluster(request: Request) -> Response:
        return render(request, "cluster.html", cluster=backend.cluster(), title="Cluster")

    def healthz(_request: Request) -> Response:
        # Alive: the process serves requests. The database is readiness's business, so a
        # database outage takes the console out of its Service instead of restarting it.
        return PlainTextResponse("ok")

    def readyz(_request: Request) -> Response:
        if backend.database_answers():
            return PlainTextResponse("ok")
        return PlainTextResponse("the database does not answer", 503)

    return [
        Route("/cluster", cluster),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
    ]
