"""`SAGA_SAGAS` finds a module where `diagram` does (the working directory), and names every entry
that does not load instead of raising an import error's traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from processor._errors import ConfigurationError
from processor._runtime.assembly import load_saga_classes
from sagas.transfer import TransferSaga


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tmp_path / "trip_here.py").write_text(
        "from sagas.transfer import TransferSaga\nSAGAS = [TransferSaga]\n"
    )
    (tmp_path / "no_list_here.py").write_text("X = 1\n")
    return tmp_path


def test_a_module_in_the_working_directory_is_found(workdir: Path) -> None:
    assert load_saga_classes(["trip_here"]) == [TransferSaga]
    assert load_saga_classes(["trip_here:TransferSaga"]) == [TransferSaga]


def test_every_entry_that_does_not_load_is_named_with_its_fix(workdir: Path) -> None:
    with pytest.raises(ConfigurationError) as e:
        load_saga_classes(["no_such_module_xyz", "no_list_here", "trip_here:TripSaga", "sagas"])
    text = str(e.value)
    assert "Invalid configuration (3)" in text
    assert "cannot load 'no_such_module_xyz': ModuleNotFoundError" in text
    assert "module 'no_list_here' has no SAGAS list: name a class (no_list_here:MySaga)" in text
    assert "cannot load 'trip_here:TripSaga': AttributeError" in text
