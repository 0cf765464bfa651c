"""Routing: which sagas each decoded record goes to, and which rows the batch must load.

An event goes to the sagas that handle its type, by their association property; a fired deadline
and an operator record name their saga; a record newer than the code goes by rule (see
``TooNew``). A record that cannot be routed is rejected with its reason. An operator record must
also be signed and sent where its saga's records are: keyed by the saga id, and (checked where
the partition counts are known, see ``misplaced``) on the partition that id maps to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from processor._authoring.messages import Message, MessageRegistry
from processor._engine.decode import (
    Decoded,
    Event,
    FiredDeadline,
    Operator,
    Reason,
    Rejected,
    TooNew,
    id_problem,
)
from processor._engine.partitioner import Partitioner, fits, partition_for
from processor._engine.rows import Wants
from processor._engine.working import Item
from processor._invocation import BoundSaga
from processor._wire import HEADER_SAGA_TYPE, OperatorAction, operator_signed

REPLAYS = (OperatorAction.PARKED_RETRY, OperatorAction.PARKED_SKIP)
"""Operator actions that replay the records held behind a parked saga."""


class Router:
    """Expands decoded records into per-saga items and names the rows to load.

    Args:
        sagas: The saga types this processor runs, by name.
        registry: Message types, for routing records newer than the code by wire name.
        operator_key: The shared key operator records are signed with; without it (and without
            ``operator_keys``) every operator record is dead-lettered, unauthenticated.
        operator_keys: Each operator's own key, by name: a record signed with one names its
            owner as "by".
    """

    def __init__(
        self,
        sagas: Mapping[str, BoundSaga],
        registry: MessageRegistry,
        *,
        operator_key: bytes | None,
        operator_keys: Mapping[str, bytes],
    ) -> None:
        self._sagas = dict(sagas)
        self._operator_key = operator_key
        self._operator_keys = dict(operator_keys)
        self._routes: dict[type[Message], list[BoundSaga]] = {}
        # For records newer than the code: by wire name, the sagas that handle some version of
        # it and the association property of the newest version they handle.
        self._routes_by_name: dict[str, dict[str, tuple[int, BoundSaga, str]]] = {}
        for bound in self._sagas.values():
            for event_cls, handler in bound.definition.event_handlers.items():
                self._routes.setdefault(event_cls, []).append(bound)
                if event_cls in registry and handler.association_property is not None:
                    entry = registry.of(event_cls)
                    by_saga = self._routes_by_name.setdefault(entry.name, {})
                    known = by_saga.get(bound.saga_type)
                    if known is None or known[0] < entry.version:
                        by_saga[bound.saga_type] = (
                            entry.version,
                            bound,
                            handler.association_property,
                        )

    @property
    def event_types(self) -> set[type[Message]]:
        """The message types some saga handles; other events are skipped."""
        return set(self._routes)

    def routes_of(self, d: Event) -> list[BoundSaga]:
        """The sagas ``d`` goes to: those handling its type, narrowed by its saga-type header.

        A reply names the saga type whose command it answers: two saga types that handle one
        reply type each get only their own replies, and a reply to a saga type this processor
        does not run (another deployment's, on a shared topic) goes to none (see
        :meth:`addressed_elsewhere`), rather than being recorded as finding no saga.
        """
        routes = self._routes.get(type(d.message), [])
        addressed = d.metadata.headers.get(HEADER_SAGA_TYPE)
        if not addressed or len(routes) == 0:
            return routes
        return [b for b in routes if b.saga_type == addressed]

    def addressed_elsewhere(self, d: Event) -> str | None:
        """The saga type ``d`` is addressed to, when it is one this processor does not run."""
        addressed: str | None = d.metadata.headers.get(HEADER_SAGA_TYPE)
        if not addressed or addressed in self._sagas or type(d.message) not in self._routes:
            return None
        return addressed

    def route(self, decoded: Iterable[Decoded]) -> tuple[list[Item | Rejected], Wants]:
        """Expands each record into per-saga items, in order, and names the rows to load."""
        out: list[Item | Rejected] = []
        wants = Wants(set(), set(), set())
        for d in decoded:
            if isinstance(d, Rejected):
                out.append(d)
            elif isinstance(d, FiredDeadline):
                bound = self._sagas.get(d.saga_type)
                if bound is None:
                    out.append(
                        Rejected(d.record, Reason.UNKNOWN_TYPE, f"no saga type {d.saga_type!r}")
                    )
                    continue
                out.append(Item(d, bound, d.saga_id))
                wants.saga_keys.add((d.saga_type, d.saga_id))
                wants.deadline_ids.add(d.deadline_id)
            elif isinstance(d, Operator):
                out.append(self._operator(d, wants))
            elif isinstance(d, TooNew):
                out.extend(self._too_new(d, wants))
            else:
                routes = self.routes_of(d)
                items: list[Item | Rejected] = []
                for bound in routes:
                    saga_id = bound.definition.association_value(d.message)
                    prop = bound.definition.event_handlers[type(d.message)].association_property
                    if saga_id is None:
                        items = [Rejected(d.record, Reason.MISSING_ASSOCIATION, f"{prop} is empty")]
                        break
                    problem = id_problem(saga_id)
                    if problem is not None:
                        items = [Rejected(d.record, Reason.INVALID_ID, f"{prop} {problem}")]
                        break
                    items.append(Item(d, bound, saga_id))
                for item in items:
                    if isinstance(item, Item):
                        key = (item.bound.saga_type, item.saga_id)
                        wants.saga_keys.add(key)
                        wants.message_keys.add((*key, item.message_id))
                out.extend(items)
        return out, wants

    def _too_new(self, d: TooNew, wants: Wants) -> list[Item | Rejected]:
        """Routes a record newer than the code by rule, without its class.

        The saga id is the value of the field the newest known version is associated by, read
        from the raw JSON; when the new version lacks that field, the record key (the wire
        format's saga id). A message no saga handles in any version is not routed.
        """
        items: list[Item | Rejected] = []
        for _, bound, prop in self._routes_by_name.get(d.metadata.message_type, {}).values():
            raw = d.data.get(prop) if isinstance(d.data, dict) else None
            if isinstance(raw, str | int) and not isinstance(raw, bool) and str(raw):
                saga_id: str | None = str(raw)
            else:
                saga_id = d.metadata.key or None
            if saga_id is None:
                return [Rejected(d.record, Reason.MISSING_ASSOCIATION, f"{prop} is empty")]
            problem = id_problem(saga_id)
            if problem is not None:
                return [Rejected(d.record, Reason.INVALID_ID, f"{prop} {problem}")]
            items.append(Item(d, bound, saga_id))
        for item in items:
            assert isinstance(item, Item)
            key = (item.bound.saga_type, item.saga_id)
            wants.saga_keys.add(key)
            wants.message_keys.add((*key, item.message_id))
        return items

    def _operator(self, d: Operator, wants: Wants) -> Item | Rejected:
        """Routes an operator record to its saga once its signature and its key check out."""
        req = d.request
        value = d.record.value or b""
        trusted = self._operator_key is not None and operator_signed(
            self._operator_key, value, d.signature
        )
        if not trusted:
            # A person's own key: who asked is the key's owner, whatever name the record says.
            owner = next(
                (
                    n
                    for n, k in self._operator_keys.items()
                    if operator_signed(k, value, d.signature)
                ),
                None,
            )
            if owner is None:
                return Rejected(d.record, Reason.UNAUTHENTICATED, "bad or missing operator-auth")
            d = dataclasses.replace(d, request=dataclasses.replace(req, by=owner))
            req = d.request
        if d.record.key != req.saga_id.encode():
            # The signature covers the value, not where the record was sent: a copy produced
            # elsewhere would be applied out of its saga's order, or beside it by another
            # replica (see also `misplaced`, for the partition).
            return Rejected(d.record, Reason.MISPLACED, "the record's key is not its saga id")
        bound = self._sagas.get(req.saga_type)
        if bound is None:
            return Rejected(d.record, Reason.UNKNOWN_TYPE, f"no saga type {req.saga_type!r}")
        key = (req.saga_type, req.saga_id)
        mkey = (*key, req.message_id)
        wants.saga_keys.add(key)
        wants.message_keys.add(mkey)
        wants.operator_keys.add(mkey)
        if req.action in REPLAYS:
            wants.held_keys.add(key)
        elif req.action == OperatorAction.RESET:
            wants.history_keys.add(key)
        return Item(d, bound, req.saga_id)


def misplaced(d: Operator, counts: tuple[int, ...], partitioner: Partitioner) -> Rejected | None:
    """Why ``d`` is refused when its partition is not one its saga id maps to; None if it is.

    The senders route a request where the saga's events go now (``processor._engine.growth``),
    so a signed record found elsewhere is a copy someone else produced there: applied, it would
    run out of order with the saga's events, or beside them on another replica.

    Args:
        d: An operator record.
        counts: The partition counts producers of its topic may hash with, the current one
            first (a grown topic's older ones too); empty when unknown: nothing is checked.
        partitioner: The producers' partitioner (``SAGA_CONSUMER__PARTITIONER``).
    """
    record = d.record
    key = d.request.saga_id.encode()
    if not counts or fits(key, record.partition, counts, partitioner):
        return None
    detail = (
        f"partition {record.partition} is not its saga's: SAGA_CONSUMER__PARTITIONER="
        f"{partitioner} puts the saga id on partition {partition_for(key, counts[0], partitioner)}"
        f" of {counts[0]}"
    )
    return Rejected(record, Reason.MISPLACED, detail)
