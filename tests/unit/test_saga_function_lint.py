"""`lint-saga` on saga functions: the calls a replay would not repeat, each with its line and
what the context offers instead; and `diagram`, which has no machine to draw for them.

``careless_trip`` below is the deliberately bad saga: every line marked ``# bad:`` must be
reported, with the replacement the mark names, and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import date, timedelta
from datetime import datetime as dt
from pathlib import Path
from time import monotonic
from typing import Any

import pytest

from processor import SagaApp, SagaContext, saga_function
from processor._authoring.functions.declare import function_spec
from processor._authoring.functions.lint import lint_function, lint_source
from processor._cli import main
from sagas.trip import TripSaga
from sagas.trip_function import trip_function
from schemas import trips as t


def _quote(trip: t.TripRequested) -> str:
    return f"{trip.trip_id}-{time.time()}"  # bad: saga.now


@saga_function(type="careless-trip", association_property="trip_id")
async def careless_trip(saga: SagaContext, trip: t.TripRequested) -> None:
    started = dt.now()  # bad: saga.now
    day = date.today()  # bad: saga.now.date()
    tick = monotonic()  # bad: saga.now
    seat = random.choice(["1A", "2B"])  # bad: saga.random()
    token = secrets.token_hex(8)  # bad: saga.random()
    ref = uuid.uuid4()  # bad: saga.uuid()
    region = os.environ.get("REGION", "eu")  # bad: Setting(
    with open("/etc/hostname") as f:  # bad: saga.call(
        host = f.read()
    import httpx  # bad: saga.call(

    httpx.get("https://example.invalid")  # bad: saga.call(
    subprocess.run(["true"], check=False)  # bad: saga.call(
    threading.Thread(target=print).start()  # bad: saga.call(
    time.sleep(1)  # bad: await saga.sleep(
    await asyncio.sleep(1)  # bad: await saga.sleep(
    await asyncio.gather()  # bad: one after another
    quote = _quote(trip)
    # Fine: the context's clock, randomness and ids; printing; a deterministic uuid.
    print(started, day, tick, seat, token, ref, region, host, quote, saga.now, saga.uuid())
    random_seat = saga.random().choice(["1A", "2B"])
    stable = uuid.uuid5(uuid.NAMESPACE_URL, trip.trip_id)
    await saga.call(
        t.ReserveFlight(trip_id=trip.trip_id, flight=f"{trip.flight}{random_seat}{stable}"),
        expects=t.FlightReserved,
        timeout=timedelta(minutes=1),
    )


_MARK = "# bad" + ": "  # built, so that this line is not a mark itself


def _marked() -> dict[int, str]:
    """Line -> the replacement each ``# bad:`` mark of this file names."""
    lines = Path(__file__).read_text().splitlines()
    return {n: line.split(_MARK)[1] for n, line in enumerate(lines, 1) if _MARK in line}


def _func(cls: type) -> Callable[..., Any]:
    spec = function_spec(cls)
    assert spec is not None
    return spec.func


def test_every_bad_call_is_reported_at_its_line_with_its_replacement() -> None:
    findings = lint_function(_func(careless_trip))
    marked = _marked()
    assert sorted({f.line for f in findings}) == sorted(marked)
    for f in findings:
        assert marked[f.line] in f.instead, (f.line, str(f))
    # The helper's clock is found through the call, and says where it is.
    [helper] = [f for f in findings if f.within is not None]
    assert helper.within == "_quote"
    assert "in _quote(), which the saga function calls" in helper.describe()
    # An aliased import is read as what it is.
    [clock] = [f for f in findings if f.code == "dt.now()"]
    assert "wall clock" in clock.why


def test_the_trip_saga_function_is_clean() -> None:
    assert lint_function(_func(trip_function)) == []


def test_a_name_the_function_binds_itself_is_not_the_module() -> None:
    source = (
        "import random, time\n"
        "async def trip(saga, time):\n"
        "    random = saga.random()\n"
        "    random.choice([1])\n"
        "    time.sleep(1)\n"
        "    open = saga.uuid\n"
        "    open()\n"
    )
    assert lint_source(source, "trip") == []


def test_imports_inside_the_function_count_and_urllib_parse_is_pure() -> None:
    source = (
        "import urllib.parse\n"
        "async def trip(saga):\n"
        "    from urllib.request import urlopen\n"
        "    import socket as s\n"
        "    urllib.parse.quote('a b')\n"
        "    urlopen('http://x')\n"
        "    s.create_connection(('x', 1))\n"
    )
    found = [(f.line, f.code) for f in lint_source(source, "trip")]
    assert found == [
        (3, "import urllib.request.urlopen"),
        (4, "import socket"),
        (6, "urlopen(...)"),
        (7, "s.create_connection(...)"),
    ]


def test_lint_saga_reports_each_finding_with_the_file_and_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(["lint-saga", f"{__name__}:careless_trip", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    problems = out["problems"]
    assert len(problems) == len(_marked())
    helper, first, *_ = sorted(_marked())  # the helper is defined above the saga function
    where = "careless-trip: tests/unit/test_saga_function_lint.py"
    assert problems[0].startswith(f"{where}:{first}: dt.now() reads the wall clock")
    # The helper comes last, after the function's own findings in line order.
    assert problems[-1].startswith(f"{where}:{helper}: time.time() in _quote(), which")


def test_lint_saga_reads_a_module_or_an_app_with_function_and_machine_sagas(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["lint-saga", "sagas.trip_function"]) == 0
    assert capsys.readouterr().out == "sagas.trip_function: no problems found in trip-function\n"
    app = SagaApp(sagas=[TripSaga, trip_function, careless_trip])
    monkeypatch.setattr(sys.modules[__name__], "lint_app", app, raising=False)
    assert main(["lint-saga", f"{__name__}:lint_app", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["checked"] == ["trip-saga", "trip-function", "careless-trip"]
    assert {p.split(":")[0] for p in out["problems"]} == {"careless-trip"}
    assert main(["lint-saga", f"{__name__}:lint_app", "--saga", "trip-function"]) == 0
    capsys.readouterr()
    assert main(["lint-saga", f"{__name__}:lint_app", "--saga", "nope"]) == 2
    assert "'careless-trip'" in capsys.readouterr().err


def test_diagram_refuses_a_saga_function_saying_what_to_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["diagram", "sagas.trip_function:trip_function"]) == 2
    err = capsys.readouterr().err
    assert "is a saga function (@saga_function), which has no state machine to draw" in err
    assert "`show` lists a running saga's journal" in err
    app = SagaApp(sagas=[TripSaga, trip_function])
    monkeypatch.setattr(sys.modules[__name__], "diagram_app", app, raising=False)
    assert main(["diagram", f"{__name__}:diagram_app", "--saga", "trip-function"]) == 2
    assert "no state machine to draw" in capsys.readouterr().err
    # The machine saga beside it is still drawn, --saga or not.
    assert main(["diagram", f"{__name__}:diagram_app"]) == 0
    assert capsys.readouterr().out.startswith("stateDiagram-v2")


def test_a_saga_function_without_a_source_file_is_reported_not_passed() -> None:
    from processor.ops._lint import lint_saga

    namespace: dict[str, Any] = {"__name__": "made_at_run_time"}
    exec(  # a function whose source is nowhere on disk, as a notebook or a generator makes
        "from datetime import timedelta\n"
        "from processor import SagaContext, saga_function\n"
        "from schemas import trips as t\n"
        "@saga_function(type='made-at-run-time', association_property='trip_id')\n"
        "async def made(saga: SagaContext, trip: t.TripRequested) -> None:\n"
        "    await saga.sleep(timedelta(minutes=1))\n",
        namespace,
    )
    [problem] = lint_saga(namespace["made"])
    assert problem == (
        "made-at-run-time: cannot read the saga function's source (made is defined in no "
        "module with a source file)"
    )
