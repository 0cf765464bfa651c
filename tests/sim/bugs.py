"""Bugs the runtime had, put back for one run so the simulator can show it finds them.

Each switch patches the source of one production function back to its old behaviour (the
text of the fix replaced by the text before it), runs it in the function's own module, and
restores the original afterwards. A fix whose text has changed since makes the switch fail
loudly rather than test nothing.
"""

from __future__ import annotations
import __future__

import inspect
import sys
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

from processor._kafka.client import SagaConsumer
from processor._runtime.consumer.intake import Intake
from processor._runtime.consumer.ownership import Claims
from processor._runtime.consumer.recovery import Recovery

__all__ = ["BUGS", "switched"]


def _patch(
    owner: type, name: str, edits: list[tuple[str, str]]
) -> Callable[[], Callable[[], None]]:
    """A switch that replaces ``owner.name`` with its source after ``edits``."""

    def on() -> Callable[[], None]:
        original = owner.__dict__[name]
        source = textwrap.dedent(inspect.getsource(original))
        for fixed, old in edits:
            if fixed not in source:
                raise AssertionError(f"{owner.__name__}.{name} no longer reads {fixed!r}")
            source = source.replace(fixed, old)
        module = sys.modules[original.__module__]
        scope: dict[str, Any] = {}
        flags = __future__.annotations.compiler_flag
        code = compile(source, f"<bug in {owner.__name__}.{name}>", "exec", flags=flags)
        exec(code, vars(module), scope)
        setattr(owner, name, scope[name])
        return lambda: setattr(owner, name, original)

    return on


def _both(*switches: Callable[[], Callable[[], None]]) -> Callable[[], Callable[[], None]]:
    def on() -> Callable[[], None]:
        undo = [s() for s in switches]

        def off() -> None:
            for u in reversed(undo):
                u()

        return off

    return on


# name -> (what the bug was, the switch that puts it back)
BUGS: dict[str, tuple[str, Callable[[], Callable[[], None]]]] = {
    "end-kept-across-revocation": (
        "a partition's end read before its revocation is stored after its next assignment, "
        "past records not yet applied (5831c14)",
        _both(
            _patch(SagaConsumer, "_assigned", [("self._ends.pop(tp, None)", "pass")]),
            _patch(SagaConsumer, "_unassign", [("self._ends.pop(tp, None)", "pass")]),
        ),
    ),
    "refused-seek-lost": (
        "a seek the Kafka client refuses is forgotten, and the next batch commits past the "
        "records between the fetch position and the sought one (388686f)",
        _patch(SagaConsumer, "seek", [("self._reseek[tp] = offset", "pass")]),
    ),
    "in-doubt-forgotten-on-failed-read": (
        "a batch in doubt is forgotten when the first read of the stored offsets fails (2622128)",
        _patch(
            Recovery,
            "resync",
            [
                (
                    "in_doubt = self._doubt = in_doubt or self._doubt",
                    "in_doubt = self._doubt = in_doubt",
                )
            ],
        ),
    ),
    "in-doubt-left-when-detached": (
        "a replica that gave its partitions back with a batch in doubt rejoins without "
        "resolving it (508a58a)",
        _patch(Recovery, "step_detached", [("if self._doubt is not None:", "if False:")]),
    ),
    "fenced-partitions-not-claimed-again": (
        "a replica fenced out of partitions it is still assigned waits for a rebalance that "
        "never comes, when the claim that fenced it was a zombie's (f9ee60c, found by tests/sim)",
        _patch(
            Recovery,
            "_fenced",
            [
                ("self._ownership.unclaimed.update(lost)", "pass"),
                ("self._ownership.claim_after = self._clock() + CLAIM_RETRY", "pass"),
            ],
        ),
    ),
    "pause-due-after-claim": (
        "a partition waiting to be paused is claimed by a later assignment's claim and stays "
        "paused for good (found by tests/sim)",
        _patch(
            Claims, "assigned", [("claimed = self.claim(only=set(tps))", "claimed = self.claim()")]
        ),
    ),
    "held-set-taken-before-read": (
        "the partitions held by a refused seek are taken before the read, so one revoked and "
        "assigned again inside it loses its fresh records (found by tests/sim)",
        _patch(SagaConsumer, "consume", [("reseek = self._reseek", "reseek = set(self._reseek)")]),
    ),
    "doubt-judged-by-moved-offsets": (
        "a batch in doubt whose partition another replica claimed and moved on since is "
        "judged not committed from offsets that no longer tell (found by tests/sim)",
        _patch(Recovery, "resync", [("if moved and not committed:", "if False:")]),
    ),
    "fences-learnt-only-by-commits": (
        "a replica fenced by a zombie's claim on a partition with no more input never learns "
        "it, and its committed outbox rows of that partition stay unpublished (found by "
        "tests/sim)",
        _patch(Recovery, "check_fences", [("if not owned:", "if True:")]),
    ),
    "markers-only-partition-left-unstored": (
        "a partition whose only entries are transaction markers is never stored past them, so "
        "a new partition following it after growth would wait for good (found by tests/sim)",
        _patch(
            Intake,
            "advance_ends",
            [
                (
                    "done = end == 0 if o is not None and o.next_offset is None else None",
                    "done = o is not None and o.next_offset is None",
                )
            ],
        ),
    ),
}


class switched:
    """Puts the named bugs back for the length of a ``with`` block."""

    def __init__(self, names: Iterable[str]) -> None:
        self._names = list(names)
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> None:
        for name in self._names:
            self._undo.append(BUGS[name][1]())

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
