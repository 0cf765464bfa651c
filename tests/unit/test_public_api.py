"""The public API: six packages, each offering what docs/api.md lists, and nothing else public.

Every other module has a component with a leading underscore in its path. The module paths and
top-level names of earlier releases still import for one release, warning with the new path and
giving the very object the new path gives, so ``isinstance`` checks and monkeypatching agree.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

import processor
from processor import _compat

PUBLIC = (
    "processor",
    "processor.participant",
    "processor.publish",
    "processor.testing",
    "processor.ops",
    "processor.settings",
)
API_PAGE = Path(processor.__file__).parents[1] / "docs" / "api.md"
# The top level is what a saga module imports: small enough to read in one go (40 names, and
# the four of sagas written as functions: saga_function, SagaContext, Undo, StepFailed).
MOST_TOP_LEVEL_NAMES = 44


def listed(page: str) -> dict[str, list[str]]:
    """The names api.md lists under each ``## `module``` heading, in their order."""
    found: dict[str, list[str]] = {}
    section: list[str] | None = None
    for line in page.splitlines():
        if heading := re.fullmatch(r"## `([\w.]+)`", line):
            section = found.setdefault(heading.group(1), [])
        elif section is not None and (item := re.match(r"- `(\w+)`: \S", line)):
            section.append(item.group(1))
    return found


def test_the_api_page_lists_exactly_each_public_module_s_names() -> None:
    pages = listed(API_PAGE.read_text())
    assert sorted(pages) == sorted(PUBLIC)
    for name in PUBLIC:
        module = importlib.import_module(name)
        assert sorted(pages[name]) == sorted(module.__all__), name
        assert len(set(module.__all__)) == len(module.__all__), name
        for attr in module.__all__:
            assert getattr(module, attr) is not None, f"{name}.{attr}"


def test_the_page_check_sees_a_name_not_listed() -> None:
    page = API_PAGE.read_text().replace("- `SagaFixture`: drives", "- drives")
    assert "SagaFixture" not in listed(page)["processor.testing"]


def test_the_top_level_stays_small() -> None:
    assert len(processor.__all__) <= MOST_TOP_LEVEL_NAMES


def _walk() -> list[str]:
    # Imports the packages (not the modules) to find what is under them.
    return [m.name for m in pkgutil.walk_packages(processor.__path__, "processor.")]


def test_every_other_module_is_internal() -> None:
    found = [processor.__name__, *_walk()]
    public = [n for n in found if not any(p.startswith("_") for p in n.split("."))]
    assert sorted(public) == sorted(PUBLIC)


def _import_old(monkeypatch: pytest.MonkeyPatch, old: str) -> tuple[ModuleType, list[str]]:
    """Imports ``old`` afresh; returns the module and the deprecation warnings, in order.

    An old path imported before (by another test) would not warn again, being in sys.modules:
    it and its old parents are taken out for the test, and come back after it.
    """
    for n in range(old.count(".")):
        monkeypatch.delitem(sys.modules, old.rsplit(".", n)[0], raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    found = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    # Each points at the line that imported it, not into the import system.
    assert {w.filename for w in found} == {__file__}
    return module, [str(w.message) for w in found]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("processor.runtime.worker", "processor._runtime.consumer.worker"),
        ("processor.machine", "processor._authoring.orchestration"),
        ("processor.cli", "processor._cli"),
        ("processor.ops.batch", "processor.ops._batch"),
        ("processor.postgres.schema", "processor._postgres.schema.tables"),
        ("processor.ports.engine", "processor._ports.consumer"),
    ],
)
def test_an_old_module_path_warns_and_gives_the_same_module(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    module, said = _import_old(monkeypatch, old)
    # The old parent package warns first (processor.runtime, then processor.runtime.worker).
    assert said[-1].startswith(f"{old} is deprecated; import {new}"), said
    assert module is importlib.import_module(new)
    assert module.__name__ == new
    # The module keeps its own spec, not the old path's.
    assert module.__spec__ is not None
    assert module.__spec__.name == new


def test_an_old_path_names_where_its_public_names_are(monkeypatch: pytest.MonkeyPatch) -> None:
    machine, said = _import_old(monkeypatch, "processor.machine")
    assert said == [
        "processor.machine is deprecated; import processor._authoring.orchestration "
        "(its public names are in processor)"
    ]
    # isinstance and issubclass agree, whichever path named the class.
    assert machine.OrchestratedSaga is processor.OrchestratedSaga
    _, said = _import_old(monkeypatch, "processor.participant.kit")
    assert said == [
        "processor.participant.kit is deprecated; import processor._authoring.participant.kit "
        "(its public names are in processor.participant)"
    ]


def test_an_import_statement_of_an_old_path_warns_at_its_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "processor.cli", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec("import processor.cli", {})  # a statement, not importlib.import_module
    [warning] = caught
    assert warning.filename == "<string>"
    assert str(warning.message) == "processor.cli is deprecated; import processor._cli"


def test_monkeypatching_an_old_path_patches_the_module_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old, _ = _import_old(monkeypatch, "processor.runtime.hooks")
    from processor._runtime import hooks

    monkeypatch.setattr(old, "PLANTED", 1, raising=False)
    assert vars(hooks)["PLANTED"] == 1


def test_a_module_new_below_an_old_package_path_is_the_same_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, said = _import_old(monkeypatch, "processor.runtime.consumer")
    assert (
        said[-1] == "processor.runtime.consumer is deprecated; import processor._runtime.consumer"
    )
    assert module is importlib.import_module("processor._runtime.consumer")


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("EventPublisher", "processor.publish"),
        ("OutboxRelay", "processor.publish"),
        ("UnknownMessageType", "processor.publish"),
        ("definition_of", "processor._authoring.definition"),
    ],
)
def test_a_name_the_top_level_no_longer_offers_warns_and_is_the_same(
    monkeypatch: pytest.MonkeyPatch, name: str, home: str
) -> None:
    # Warned once, then kept in the module: forget an earlier test's access.
    monkeypatch.delitem(vars(processor), name, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"^processor\.{name} is deprecated; .*{home}"):
        value = getattr(processor, name)
    assert value is getattr(importlib.import_module(home), name)
    assert name not in processor.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(processor, name) is value


def test_a_name_the_top_level_never_had_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = processor.Nothing


def test_every_old_path_names_a_module_that_exists() -> None:
    missing = [new for new in _compat.MOVED.values() if importlib.util.find_spec(new) is None]
    assert missing == []
    # Old paths only: a new path mapped again would load its module twice.
    assert not set(_compat.MOVED) & set(_compat.MOVED.values())
    assert not [old for old in _compat.MOVED if _compat.new_path(old) != _compat.MOVED[old]]


def test_the_finder_is_first_and_leaves_other_paths_alone() -> None:
    assert sys.meta_path[0].__class__.__name__ == "_Renamed"
    assert _compat.new_path("processor._runtime.consumer.worker") is None
    assert _compat.new_path("processor.participant") is None
    assert _compat.new_path("processor.settings.kafka") == "processor.settings._kafka"
