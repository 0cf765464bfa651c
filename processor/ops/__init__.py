"""Operator services: retry a parked saga, list deadlines, sagas by state, send requests.

Each service takes the store it reads (a port of the processor) and returns plain data; the
command line and the web console open the stores and show the results. From Python,
:class:`Adapters` opens them from the processor's settings (``inspect_queries()``,
``operator_queries()``, ``record_producer()``, ...): it needs the Kafka and PostgreSQL clients,
so it is imported on first use of its name.
"""

import importlib
from typing import TYPE_CHECKING, Any

from processor._wire import OperatorAction
from processor.ops._batch import BatchSent, Selection, select, send_batch, wait_for_batch
from processor.ops._check import CheckReport, Topology, run_check
from processor.ops._deadlines import DeadlineRow, overdue_deadlines, pending_deadlines
from processor.ops._diagram import load_spec, svg
from processor.ops._inspect import (
    NoSuchSaga,
    NotSent,
    OperatorRefused,
    RequestDeadLettered,
    purge_dead_letters,
    replay_dead_letter,
    send_operator_request,
    show_saga,
    wait_for_outcome,
)
from processor.ops._machines import MachineSummary, machine_summary
from processor.ops._outbox import (
    NoFailedRows,
    NothingSelected,
    discard_failed_rows,
    list_failed_rows,
    retry_failed_rows,
)
from processor.ops._parked import NotParked, RetryResult, list_parked, retry_parked_saga
from processor.ops._progress import step_progress
from processor.ops._topics import TopicsVerdict, check_topics, plan_topics

if TYPE_CHECKING:
    from processor._bootstrap.adapters import Adapters

__all__ = [
    "Adapters",
    "BatchSent",
    "CheckReport",
    "DeadlineRow",
    "MachineSummary",
    "NoFailedRows",
    "NoSuchSaga",
    "NotParked",
    "NotSent",
    "NothingSelected",
    "OperatorAction",
    "OperatorRefused",
    "RequestDeadLettered",
    "RetryResult",
    "Selection",
    "TopicsVerdict",
    "Topology",
    "check_topics",
    "discard_failed_rows",
    "list_failed_rows",
    "list_parked",
    "load_spec",
    "machine_summary",
    "overdue_deadlines",
    "pending_deadlines",
    "plan_topics",
    "purge_dead_letters",
    "replay_dead_letter",
    "retry_failed_rows",
    "retry_parked_saga",
    "run_check",
    "select",
    "send_batch",
    "send_operator_request",
    "show_saga",
    "step_progress",
    "svg",
    "wait_for_batch",
    "wait_for_outcome",
]


def __getattr__(name: str) -> Any:
    # The composition root imports the clients; the services above do not.
    if name == "Adapters":
        return importlib.import_module("processor._bootstrap.adapters").Adapters
    raise AttributeError(f"module 'processor.ops' has no attribute {name!r}")
