"""Whole-box CPU of a timed window: the processor's, PostgreSQL's and the Kafka broker's.

Read from /proc, so only for servers on this machine (in the same PID namespace); a server that
is elsewhere reads as ``None`` and the box total leaves it out, saying so.

- Processor: this process's user + system time (every thread), or the caller's own reading
  when the processor is another process (the Quix peer reads itself and reports the delta).
- PostgreSQL: the postmaster's own time, its reaped children's (a backend that exited lands in
  the postmaster's cutime/cstime once the postmaster has waited for it), and the live children's
  (backends, checkpointer, WAL writer, autovacuum). Read at both ends of a window, a backend that
  lives through it counts by its own delta, one that exits within it by its final total minus
  what it had at the start. Every client of the server counts: on a shared server, so does
  whatever else runs against it.
- Kafka: the broker JVM's user + system time (every thread).
- WAL: the records PostgreSQL wrote to its write-ahead log (``pg_stat_wal``), server-wide like
  its CPU; each row and each index entry written is one, so it counts what a design writes. A
  backend adds its records to ``pg_stat_wal`` at most once a second while it runs, and all of
  them when it exits: read it around a side whose connections are closed by the second reading
  (:func:`wal_records`), not at instants inside a run.

Memory: the kernel's high-water mark of this process's resident set (VmHWM), which writing
``5`` to /proc/self/clear_refs resets to the current resident set.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

_PROC = Path("/proc")
_TICK = float(os.sysconf("SC_CLK_TCK"))
# /proc/<pid>/stat fields after "pid (comm)": state is field 3, so field k is at index k - 3.
_PPID, _UTIME, _STIME, _CUTIME, _CSTIME = 1, 11, 12, 13, 14
_LISTEN = "0A"


def _fields(pid: int) -> list[str] | None:
    """The stat fields after the command name (which may hold spaces and parentheses)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def process_seconds(pid: int, *, reaped_children: bool = False) -> float | None:
    """User + system CPU seconds of a process, with its waited-for children's if asked."""
    f = _fields(pid)
    if f is None:
        return None
    ticks = int(f[_UTIME]) + int(f[_STIME])
    if reaped_children:
        ticks += int(f[_CUTIME]) + int(f[_CSTIME])
    return ticks / _TICK


def parent_of(pid: int) -> int | None:
    f = _fields(pid)
    return int(f[_PPID]) if f is not None else None


def children_of(pid: int) -> list[int]:
    """Live children: the kernel's list when it keeps one, else a scan of /proc."""
    listed = _PROC / str(pid) / "task" / str(pid) / "children"
    with contextlib.suppress(OSError):
        # Complete for a single-threaded parent such as the postmaster.
        return [int(c) for c in listed.read_text().split()]
    found = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) == pid:
            found.append(int(entry.name))
    return found


def tree_seconds(pid: int) -> float | None:
    """CPU seconds of a process, its reaped children and its live children (see the module)."""
    total = process_seconds(pid, reaped_children=True)
    if total is None:
        return None
    for child in children_of(pid):
        total += process_seconds(child) or 0.0
    return total


def postmaster_pid(database_url: str) -> int | None:
    """The postmaster of the server at ``database_url``, if it runs on this machine."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        backend = int(row[0]) if row else 0
        # Read while the backend lives. A server in another PID namespace (a container) gives
        # a pid that is some other process here, or none: the parent must look like postgres.
        parent = parent_of(backend)
    if parent is None or "postgres" not in _cmdline(parent) + _cmdline(backend):
        return None
    return parent


def broker_pid(bootstrap: str) -> int | None:
    """The process listening on the first bootstrap address's port, or a `kafka.Kafka` JVM."""
    port = int(bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)[1])
    return listener_pid(port) or _by_cmdline("kafka.Kafka")


def listener_pid(port: int) -> int | None:
    """The process holding a listening TCP socket on ``port`` (any address)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (_PROC / "net" / table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
    return None


def _by_cmdline(needle: str) -> int | None:
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and needle in _cmdline(int(entry.name)):
            return int(entry.name)
    return None


def _cmdline(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass(frozen=True)
class Usage:
    """CPU seconds per part of the box; ``None`` for a part not read (not on this machine)."""

    processor: float
    postgres: float | None
    kafka: float | None

    def minus(self, earlier: Usage) -> Usage:
        return Usage(
            self.processor - earlier.processor,
            _sub(self.postgres, earlier.postgres),
            _sub(self.kafka, earlier.kafka),
        )

    def without(self, seconds: float) -> Usage:
        """The same, with ``seconds`` of the processor's CPU that was not the processor's
        (a harness thread in the same process) taken out."""
        return replace(self, processor=self.processor - seconds)

    def per_event(self, events: int) -> dict[str, float | None]:
        """Microseconds per event: ``processor_us``, ``postgres_us``, ``kafka_us``, ``box_us``."""
        n = max(events, 1)
        parts = {"processor": self.processor, "postgres": self.postgres, "kafka": self.kafka}
        out: dict[str, float | None] = {
            f"{k}_us": (v / n * 1e6 if v is not None else None) for k, v in parts.items()
        }
        out["box_us"] = sum(v for v in parts.values() if v is not None) / n * 1e6
        return out

    def to_json(self) -> dict[str, float | None]:
        return asdict(self)

    @classmethod
    def from_json(cls, given: dict[str, Any]) -> Usage:
        return cls(float(given["processor"]), given.get("postgres"), given.get("kafka"))


def _sub(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


@dataclass(frozen=True)
class Meter:
    """Reads the box's CPU: this process, the postmaster's tree and the broker."""

    postmaster: int | None
    broker: int | None

    @classmethod
    def find(cls, kafka: str, database_url: str) -> Meter:
        return cls(postmaster_pid(database_url), broker_pid(kafka))

    def read(self) -> Usage:
        return Usage(
            time.process_time(),
            tree_seconds(self.postmaster) if self.postmaster is not None else None,
            process_seconds(self.broker) if self.broker is not None else None,
        )

    def to_json(self) -> dict[str, int | None]:
        return {"postmaster": self.postmaster, "broker": self.broker}


def wal_records(database_url: str) -> float | None:
    """The server's WAL records so far (``pg_stat_wal``, PostgreSQL 14+); None before 14."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT wal_records FROM pg_stat_wal").fetchone()
        except psycopg.errors.UndefinedTable:
            return None
    return float(row[0]) if row else None


# -- memory --------------------------------------------------------------------------------------


def reset_peak_rss() -> float:
    """Resets this process's VmHWM to its current resident set; returns that, in MB."""
    (_PROC / "self" / "clear_refs").write_text("5")
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """The resident set's high-water mark since the last reset (or the process start), in MB."""
    return _status_mb("VmHWM")


def _status_mb(key: str) -> float:
    for line in (_PROC / "self" / "status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {key} in /proc/self/status")
