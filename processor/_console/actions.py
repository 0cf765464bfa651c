"""The console's actions: form POSTs that change a saga, a dead letter or a failed outbox row.

Each one needs the page's form token, a reason and an identity whose role allows it (see
:mod:`processor._console.auth`); what destroys for good also asks for a confirmation. A key sent
with an action is throttled like a sign-in. The identity is recorded as "by".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from urllib.parse import quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from processor._console.auth import Identity, allowed
from processor._console.backend import Backend
from processor._console.protect import Keys, row_id
from processor._errors import SagaError
from processor._wire import OperatorAction

__all__ = ["Guard", "action_routes", "checked_form"]

# Actions that destroy what cannot be had back: their forms ask for a confirmation (terminate asks
# its own, naming what it leaves undone).
_FOR_GOOD = frozenset({"purge", "discard"})


@dataclass(frozen=True)
class Guard:
    """Who may act: the form and key checks, whether actions are on, and the shared token's name."""

    keys: Keys
    who: Callable[[Request], Identity]
    enabled: bool
    token_name: str


async def checked_form(
    guard: Guard, request: Request, action: str
) -> tuple[dict[str, str], Identity, Response | None]:
    """The posted form of ``action`` and who acts, or the response that refuses it.

    Refused: actions off, no form token of this page, a wrong key sent with it, a role that does
    not allow the action (403), no reason (400), or no confirmation of what cannot be undone.
    """
    identity = guard.who(request)
    if not guard.enabled:
        return {}, identity, Response("actions are disabled", 403)
    form, refused = await guard.keys.form(request)
    if refused is not None:
        return form, identity, refused
    if form.get("token"):
        # A key sent with the action: the shared token, or an operator's own with its name.
        name = form.get("operator") or guard.token_name
        signed, refused = guard.keys.sign_in(request, name, form["token"])
        if refused is not None:
            return form, identity, refused
        if signed is None:
            return form, identity, Response("wrong token", 403)
        identity = signed
    needed = allowed(identity, action)
    if needed is not None:
        who_text = identity.name or "nobody signed in"
        return form, identity, Response(f"{action} needs the {needed} role ({who_text})", 403)
    if not form.get("reason", "").strip():
        return form, identity, Response("a reason is required", 400)
    if action in _FOR_GOOD and form.get("confirm") != "yes":
        return form, identity, Response(f"{action} cannot be undone: confirm it", 400)
    return form, identity, None


def action_routes(backend: Backend, guard: Guard) -> list[Route]:
    """The POST routes of the actions over ``backend``, each checked by ``guard``."""

    async def _form(
        request: Request, action: str
    ) -> tuple[dict[str, str], Identity, Response | None]:
        return await checked_form(guard, request, action)

    async def saga_action(request: Request) -> Response:
        action = request.path_params["action"]
        form, identity, refused = await _form(request, action)
        if refused is not None:
            return refused
        saga_type = request.path_params["saga_type"]
        saga_id = request.path_params["saga_id"]
        reason = form["reason"]
        by = identity.name
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
                decision = (form.get("decision") if action == "resolve" else None) or None
                send = partial(backend.request, actor=by)
                mid = await run_in_threadpool(send, op, saga_type, saga_id, reason, decision)
                entry, status = await run_in_threadpool(backend.outcome, saga_type, saga_id, mid)
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
                    partial(backend.request, actor=by),
                    op,
                    saga_type,
                    saga_id,
                    reason,
                    form.get("name") or None,
                )
                notice = f"{action} sent as {mid}; it shows in the timeline once applied"
        except (SagaError, KeyError) as e:
            notice = f"{action} refused: {e}"
        query = urlencode({"notice": notice})
        # Quoted whole: an id may hold any character, a line break included.
        page = f"/saga/{quote(saga_type, safe='')}/{quote(saga_id, safe='')}"
        return RedirectResponse(f"{page}?{query}", 303)

    async def dead_letter_action(request: Request) -> Response:
        action = request.path_params["action"]
        form, identity, refused = await _form(request, action)
        if refused is not None:
            return refused
        reason = form["reason"]
        try:
            row = _row(request)
        except SagaError as e:
            return Response(str(e), 400)
        try:
            if action == "replay":
                await run_in_threadpool(
                    partial(backend.replay_dead_letter, actor=identity.name, reason=reason), row
                )
            else:
                await run_in_threadpool(
                    partial(backend.purge_dead_letter, actor=identity.name, reason=reason), row
                )
            notice = f"dead letter {row}: {action} done"
        except SagaError as e:
            notice = f"{action} refused: {e}"
        return RedirectResponse("/dead-letters?" + urlencode({"notice": notice}), 303)

    async def outbox_action(request: Request) -> Response:
        retry = request.path_params["action"] == "retry"
        form, identity, refused = await _form(request, "outbox-retry" if retry else "discard")
        if refused is not None:
            return refused
        try:
            row = _row(request)
        except SagaError as e:
            return Response(str(e), 400)
        try:
            rows = await run_in_threadpool(
                partial(backend.outbox_action, actor=identity.name),
                row,
                retry,
                form["reason"],
            )
            notice = f"{len(rows)} rows {'put back' if retry else 'discarded'}"
        except SagaError as e:
            notice = f"refused: {e}"
        return RedirectResponse("/failed-outbox?" + urlencode({"notice": notice}), 303)

    def _row(request: Request) -> int:
        found = row_id("row id", str(request.path_params["row_id"]))
        assert found is not None
        return found

    return [
        Route("/saga/{saga_type}/{saga_id}/{action}", saga_action, methods=["POST"]),
        Route("/dead-letters/{row_id:int}/{action}", dead_letter_action, methods=["POST"]),
        Route("/failed-outbox/{row_id:int}/{action}", outbox_action, methods=["POST"]),
    ]
