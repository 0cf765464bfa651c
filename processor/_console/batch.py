"""The sagas list's batch form: one action on every saga the list's filters match, for admins.

Two POSTs to ``/sagas/batch``, each checked as every action is (:func:`checked_form`: form token,
role, reason). The first shows what would be touched (the count and the first sagas, a dry run);
the second carries the count the admin typed back and sends the batch, unless the sagas
matching now are not that many. Selection and sending are :mod:`processor.ops._batch`'s, as for
`saga cancel --where ...`; the console does not wait for the outcomes, it shows the batch's
audit entries instead.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from processor._console.actions import Guard, checked_form
from processor._console.backend import Backend
from processor._errors import SagaError
from processor.ops._batch import LIMIT, WHERE_KEYS, confirmed

__all__ = ["ACTIONS", "batch_routes"]

ACTIONS = ("cancel", "retry", "terminate")
"""What the form offers (a batch resolve needs a decision per kind of saga: the CLI's)."""
# Sagas the confirmation page lists; its count covers them all.
SHOWN = 20


def batch_routes(backend: Backend, guard: Guard, render: Callable[..., Response]) -> list[Route]:
    """The batch form's POST route over ``backend``, checked by ``guard``; pages by ``render``."""

    async def batch(request: Request) -> Response:
        form, identity, refused = await checked_form(guard, request, "batch")
        if refused is not None:
            return refused
        action = form.get("action", "")
        if action not in ACTIONS:
            return Response(f"bad action: one of {', '.join(ACTIONS)}", 400)
        where = {k: form[k] for k in WHERE_KEYS if form.get(k, "").strip()}
        if not where:
            message = "filter the list first: a batch acts on the sagas its filters match"
            return render(request, "error.html", 400, message=message, title="Bad request")
        try:
            chosen = await run_in_threadpool(backend.batch_select, action, where, LIMIT)
        except SagaError as e:
            return render(request, "error.html", 400, message=str(e), title="Bad request")
        n = len(chosen.sagas)
        page: dict[str, Any] = {
            "identity": identity,
            "action": action,
            "where": where,
            "reason": form["reason"],
            "selection": chosen,
            "shown": chosen.sagas[:SHOWN],
            "title": f"{action} {n} sagas?",
        }
        answer = form.get("confirm", "")
        if not answer:
            return render(request, "batch.html", **page)
        # The count typed back must be the count now: sagas that moved on change it.
        if not n or not confirmed(answer, n):
            notice = f"{n} sagas match now, not the count confirmed: nothing sent"
            return render(request, "batch.html", 409, notice=notice, **page)
        if action == "terminate" and form.get("force") != "yes":
            notice = "terminate undoes nothing; tick the box to confirm, or cancel instead"
            return render(request, "batch.html", 400, notice=notice, **page)
        try:
            sent = await run_in_threadpool(
                partial(backend.batch_send, actor=identity.name), chosen, form["reason"]
            )
        except SagaError as e:
            return render(request, "batch.html", 400, notice=f"refused: {e}", **page)
        notice = f"batch {sent.batch}: {action} sent to {len(sent.sent)} of {n} sagas"
        if sent.not_sent:
            notice += f", {len(sent.not_sent)} not sent ({sent.not_sent[0]['error']})"
        return RedirectResponse("/audit?" + urlencode({"batch": sent.batch, "notice": notice}), 303)

    return [Route("/sagas/batch", batch, methods=["POST"])]
