"""The complete sagas of docs/sagas.md, run from the page itself: its code blocks marked
`<!-- checked: ... -->` are executed as one module per saga, and the tests the page shows are run.

So the page cannot drift from what works: a renamed parameter or a changed behaviour fails here.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "sagas.md"
_CHECKED = re.compile(r"<!-- checked: (?P<what>[^>]*) -->\n```python\n(?P<code>.*?)\n```", re.S)


def _blocks() -> dict[str, str]:
    return {m["what"]: m["code"] for m in _CHECKED.finditer(PAGE.read_text())}


def _module(
    name: str, *blocks: str, given: types.ModuleType | None = None
) -> Iterator[types.ModuleType]:
    found = _blocks()
    module = types.ModuleType(name)
    module.__dict__.update({k: v for k, v in vars(given or module).items() if k[0] != "_"})
    # A module of its own, as a reader's file would be: dataclasses and pydantic look their
    # forward references up through sys.modules.
    sys.modules[module.__name__] = module
    try:
        for block in blocks:
            exec(compile(found[block], f"{PAGE}:{block}", "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[module.__name__]


@pytest.fixture(scope="module")
def page() -> Iterator[types.ModuleType]:
    yield from _module("docs_sagas_page", "the saga", "the tests")


@pytest.fixture(scope="module")
def function_page() -> Iterator[types.ModuleType]:
    # The page's tests run against the file's function, which the page shows whole (checked
    # below): a saga function reads the events it awaits from its source file, which code
    # executed from the page has not.
    # (`sagas.trip_function` names the saga, which the package imports over its module's name.)
    given = importlib.import_module("sagas.trip_function")
    yield from _module("docs_sagas_function", "the function's tests", given=given)


def test_the_page_shows_the_saga_file_whole() -> None:
    saga = (Path(__file__).resolve().parents[2] / "sagas" / "trip.py").read_text()
    assert _blocks()["the saga"] in saga


def test_the_pages_saga_is_at_most_sixty_lines_of_code() -> None:
    """Counted as the issue counts saga code: no blank, comment or one-line docstring lines."""
    lines = [x.strip() for x in _blocks()["the saga"].splitlines()]
    code = [x for x in lines if x and not x.startswith(("#", '"""'))]
    assert len(code) <= 60, len(code)


def test_every_test_on_the_page_passes(page: types.ModuleType) -> None:
    _run_tests(page)


def test_the_page_shows_the_saga_function_file_whole() -> None:
    saga = (Path(__file__).resolve().parents[2] / "sagas" / "trip_function.py").read_text()
    assert _blocks()["the function"] in saga


def test_every_test_of_the_saga_function_on_the_page_passes(
    function_page: types.ModuleType,
) -> None:
    _run_tests(function_page)


def _run_tests(module: types.ModuleType) -> None:
    tests = {n: f for n, f in vars(module).items() if n.startswith("test_") and callable(f)}
    assert len(tests) >= 3, sorted(tests)
    for test in tests.values():
        test()
