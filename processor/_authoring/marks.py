"""What the handler decorators of sagas and participants share.

A method decorator only marks its function, and a class decorator collects the marks it knows.
A mark of the other kind (a ``@command_handler`` in a ``@saga`` class) used to be skipped without
a word, and a decorator written without its parentheses silently replaced the method, so both
show up only later, as a command nobody handles. Each mark therefore records its family, each
class decorator reports the marks of the other family, and a decorator used bare says how to
write it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from processor._errors import SagaDefinitionError

__all__ = [
    "PARTICIPANT",
    "SAGA",
    "Family",
    "attached",
    "class_attributes",
    "foreign_handlers",
    "keep_one",
    "spelling",
    "tag",
    "used_bare",
]

_FAMILY = "__handler_family__"

_D = TypeVar("_D")
_K = TypeVar("_K")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_H = TypeVar("_H", bound=_Named)


@dataclass(frozen=True)
class Family:
    """The handlers one class decorator runs.

    Attributes:
        kind: What one handler is called (``"command handler"``).
        runner: What runs them (``"a participant"``).
        decorator: The class decorator, spelt as written (``"@participant(name='...')"``).
    """

    kind: str
    runner: str
    decorator: str

    @property
    def short(self) -> str:
        """The class decorator's bare name (``"@participant"``)."""
        return self.decorator.split("(", 1)[0]


SAGA = Family("saga handler", "a saga", "@saga(type='...') on a SagaState subclass")
PARTICIPANT = Family("command handler", "a participant", "@participant(name='...')")


def tag(func: Callable[..., Any], family: Family, decorator: str) -> None:
    """Record that ``@decorator`` of ``family`` marked ``func``."""
    setattr(func, _FAMILY, (family, decorator))


def spelling(func: object) -> str | None:
    """How ``func`` was marked (``"@saga_event_handler"``, ``"on_reply(...)"``), or None."""
    found = getattr(func, _FAMILY, None)
    return str(found[1]) if found is not None else None


def foreign_handlers(cls: type, family: Family) -> list[str]:
    """One problem per method of ``cls`` (or its bases) marked by another family's decorator.

    Args:
        cls: The class being decorated.
        family: The family its class decorator runs.

    Returns:
        E.g. ``"handler Hotel.cancel is a command handler (@command_handler), and command
        handlers run only in a participant: decorate the class with @participant(name='...'),
        not @saga"``.
    """
    problems = []
    for name, attr in class_attributes(cls):
        found = getattr(attr, _FAMILY, None) if callable(attr) else None
        if found is None:
            continue
        other, decorator = found
        if other != family:
            problems.append(
                f"handler {cls.__qualname__}.{name} is a {other.kind} ({decorator}), and "
                f"{other.kind}s run only in {other.runner}: decorate the class with "
                f"{other.decorator}, not {family.short}"
            )
    return problems


def class_attributes(cls: type) -> Iterator[tuple[str, Any]]:
    """Each attribute name of ``cls`` or its bases once, with the value the class sees.

    The most derived definition of a name is the one the class has, so a base's handler that a
    subclass overrides is not listed.
    """
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, attr in vars(klass).items():
            if name not in seen:
                seen.add(name)
                yield name, attr


def used_bare(decorator: str, target: object, spelling: str) -> SagaDefinitionError:
    """The error for ``@decorator`` written without the arguments it needs.

    Args:
        decorator: Its name, e.g. ``"saga_event_handler"``.
        target: The function or class it was applied to.
        spelling: How to write it, e.g. ``"@saga_event_handler(association_property='...')"``.
    """
    name = getattr(target, "__qualname__", repr(target))
    return SagaDefinitionError([f"@{decorator} on {name} needs arguments; write {spelling}"])


def attached(cls: object, attribute: str, kind: type[_D], refusal: str) -> _D:
    """The definition a class decorator attached to ``cls`` as ``attribute``.

    Read from the class's own namespace: a subclass of a saga or a participant is not itself
    one.

    Args:
        cls: The class asked about.
        attribute: Where its class decorator keeps the definition.
        kind: The definition's type.
        refusal: What is wrong when there is none, after the class (``"is not a saga; ..."``).

    Raises:
        SagaDefinitionError: ``cls`` is not a class its decorator defined.
    """
    definition = vars(cls).get(attribute) if isinstance(cls, type) else None
    if not isinstance(definition, kind):
        raise SagaDefinitionError([f"{cls!r} {refusal}"])
    return definition


def keep_one(handlers: dict[_K, _H], key: _K, handler: _H, what: str, problems: list[str]) -> None:
    """Keeps ``handler`` as the one for ``key``, or adds the problem of a second one.

    Args:
        handlers: The handlers found so far, by what they handle.
        key: What ``handler`` handles.
        handler: The handler found.
        what: ``key`` as a problem names it (``"event OrderPlaced"``, ``"deadline 'expiry'"``).
        problems: Where the problem goes.
    """
    kept = handlers.setdefault(key, handler)
    if kept is not handler:
        problems.append(f"{what} has two handlers ({kept.name}, {handler.name}); keep exactly one")
