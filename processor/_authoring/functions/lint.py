"""What `lint-saga` reads in a saga function's source: calls a replay would not repeat.

A saga function runs again from its start against its journal whenever it is not held in
memory, so whatever it reads from outside the journal (the clock, randomness, the environment,
the network) may read differently the second time, and whatever it does outside the journal
(a sleep, a request, a thread) is done again. The checks here are static and cheap: they read
the module's source with :mod:`ast`, resolve names through the module's imports (``from
datetime import datetime as dt`` makes ``dt.now()`` the wall clock), and look at the saga
function's body and the module-level functions it calls by name. They find the obvious
mistakes, not every one: a dependency's method or a value computed elsewhere is not followed.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

__all__ = ["Finding", "lint_function", "lint_source"]

_CLOCK = "reads the wall clock, which a replay reads again later"
_RANDOM = "draws a value a replay draws differently"
_IO = "does I/O of its own, which a replay does again"

# (what it does, the replacement): keyed by a dotted name; a key names that object and,
# when it is a module, everything in it.
_RULES: dict[str, tuple[str, str]] = {
    **{
        f"datetime.datetime.{name}": (_CLOCK, "read saga.now")
        for name in ("now", "utcnow", "today")
    },
    "datetime.date.today": (_CLOCK, "read saga.now.date()"),
    **{
        f"time.{name}": (_CLOCK, "read saga.now")
        for name in (
            "time",
            "time_ns",
            "monotonic",
            "monotonic_ns",
            "perf_counter",
            "perf_counter_ns",
        )
    },
    "time.sleep": (
        "blocks the worker and is forgotten by a restart",
        "await saga.sleep(timedelta(...))",
    ),
    "random": (_RANDOM, "draw from saga.random()"),
    "secrets": (_RANDOM, "draw from saga.random(), or take an id from saga.uuid()"),
    "uuid.uuid1": (_RANDOM, "take an id from saga.uuid()"),
    "uuid.uuid4": (_RANDOM, "take an id from saga.uuid()"),
    "os.urandom": (_RANDOM, "draw from saga.random()"),
    "os.environ": (
        "reads the environment, which may differ on the replica that replays",
        "declare a setting parameter (Annotated[T, Setting('...')])",
    ),
    "os.getenv": (
        "reads the environment, which may differ on the replica that replays",
        "declare a setting parameter (Annotated[T, Setting('...')])",
    ),
    "builtins.open": (_IO, "ask a participant with saga.call(...), or inject a dependency"),
    "builtins.input": (_IO, "wait for a person with saga.wait(...) or saga.escalate(...)"),
    **{
        module: (_IO, "ask a participant with saga.call(...)")
        for module in (
            "requests",
            "httpx",
            "aiohttp",
            "socket",
            "urllib.request",
            "urllib3",
            "http.client",
            "subprocess",
            "os.system",
            "os.popen",
        )
    },
    "asyncio.sleep": (
        "suspends outside the journal: a restart forgets it",
        "await saga.sleep(timedelta(...))",
    ),
    "asyncio": (
        "runs outside the journal: the function awaits only its context's operations",
        "await saga.call(...), saga.wait(...), saga.sleep(...) one after another",
    ),
    **{
        module: (
            "runs code beside the function that a replay does not see",
            "ask a participant with saga.call(...)",
        )
        for module in ("threading", "concurrent.futures", "multiprocessing")
    },
}
_BUILTINS = frozenset({"open", "input"})


@dataclass(frozen=True, slots=True)
class Finding:
    """One call the function should not make.

    Attributes:
        line: Its line in the module's file.
        code: The call or name as written (``datetime.now()``).
        why: What is wrong with it in a saga function.
        instead: What to use instead.
        within: The module-level function it is in, when not the saga function itself.
    """

    line: int
    code: str
    why: str
    instead: str
    within: str | None = None

    def describe(self) -> str:
        """The finding without its line: what is called, where, why not, and what instead."""
        where = f" in {self.within}(), which the saga function calls," if self.within else ""
        return f"{self.code}{where} {self.why}; {self.instead}"

    def __str__(self) -> str:
        return f"line {self.line}: {self.describe()}"


def lint_function(func: Callable[..., Any]) -> list[Finding]:
    """The findings in ``func``, read from its module's source file.

    Raises:
        OSError: The source cannot be read (a function made at run time, a module without a
            file).
    """
    module = inspect.getmodule(func)
    if module is None:
        raise OSError(f"{func.__qualname__} is defined in no module with a source file")
    code = getattr(func, "__code__", None)
    first = code.co_firstlineno if code is not None else None
    return lint_source(inspect.getsource(module), func.__name__, first)


def lint_source(source: str, name: str, line: int | None = None) -> list[Finding]:
    """The findings in the function ``name`` of a module's ``source``, in line order.

    Args:
        source: The module's whole source: its imports say what the names are.
        name: The saga function.
        line: Where it starts (its first decorator's line, as ``co_firstlineno`` says), to tell
            apart two functions of that name.

    Raises:
        LookupError: The source defines no function ``name``.
    """
    tree = ast.parse(source)
    top = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    target = _find(tree, name, line)
    names = _imports(tree.body)
    findings: list[Finding] = []
    seen: set[str] = set()
    todo: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str | None]] = [(target, None)]
    while todo:
        func, within = todo.pop()
        seen.add(func.name)
        local = {**names, **_imports(ast.walk(func))}
        shadowed = _bound(func)
        for stmt in func.body:
            findings.extend(_check(stmt, local, shadowed, within))
            # Module-level helpers it calls by name run on every replay as well.
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    called = top.get(node.func.id)
                    if called is not None and called.name not in seen and node.func.id not in local:
                        seen.add(called.name)
                        todo.append((called, called.name))
    return sorted(set(findings), key=lambda f: (f.within is not None, f.line, f.code))


def _find(tree: ast.Module, name: str, line: int | None) -> ast.FunctionDef | ast.AsyncFunctionDef:
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
    ]
    if line is not None:
        at = [n for n in found if line in (n.lineno, *(d.lineno for d in n.decorator_list))]
        found = at or found
    if not found:
        raise LookupError(f"no function {name!r} in the source")
    return found[0]


def _imports(nodes: Any) -> dict[str, str]:
    """Local name -> the dotted name it was imported as."""
    names: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname is not None:
                    names[a.asname] = a.name
                else:
                    root = a.name.split(".")[0]
                    names[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _bound(func: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """Names the function binds itself: its parameters and assignments (they shadow builtins)."""
    args = func.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    params += [a for a in (args.vararg, args.kwarg) if a is not None]
    stored = {
        n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    return frozenset({a.arg for a in params} | stored)


def _check(
    stmt: ast.stmt, names: dict[str, str], shadowed: frozenset[str], within: str | None
) -> Iterator[Finding]:
    for node, code in _uses(stmt):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names if node.module]
            )
            for module in modules:
                rule = _rule(module)
                if rule is not None:
                    yield Finding(node.lineno, f"import {module}", *rule, within)
            continue
        dotted = _dotted(node, names, shadowed)
        rule = _rule(dotted) if dotted is not None else None
        if rule is not None:
            yield Finding(node.lineno, code, *rule, within)


def _uses(node: ast.AST) -> Iterator[tuple[ast.stmt | ast.expr, str]]:
    """Imports, and the outermost names and attribute chains read, with how they are written.

    A chain that matches no rule is looked into (``datetime.now().date`` holds
    ``datetime.now``); annotations are skipped: naming a type runs nothing.
    """
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, ""
        return
    if isinstance(node, ast.Call) and _is_chain(node.func):
        yield node.func, f"{ast.unparse(node.func)}({'...' if node.args or node.keywords else ''})"
        for child in (*node.args, *node.keywords):
            yield from _uses(child)
        return
    if _is_chain(node) and isinstance(getattr(node, "ctx", None), ast.Load):
        yield node, ast.unparse(node)
        return
    for field, value in ast.iter_fields(node):
        if field in ("annotation", "returns"):
            continue
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from _uses(child)


def _is_chain(node: ast.AST) -> TypeGuard[ast.Attribute | ast.Name]:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _dotted(node: ast.AST, names: dict[str, str], shadowed: frozenset[str]) -> str | None:
    """The dotted name a chain reads (``dt.now`` -> ``datetime.datetime.now``), or None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id in shadowed:
        return None
    if node.id in names:
        root = names[node.id]
    elif node.id in _BUILTINS:
        root = f"builtins.{node.id}"
    else:
        return None
    return ".".join([root, *reversed(parts)])


def _rule(dotted: str) -> tuple[str, str] | None:
    """The rule for ``dotted``: its own, else its nearest enclosing module's."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        found = _RULES.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None
