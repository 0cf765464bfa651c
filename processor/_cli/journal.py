"""`show`'s lines for a saga function: its journal as a table, then the await it is suspended on."""

from __future__ import annotations

from processor._cli.commands import text_table
from processor._ports.views import FunctionJournal, PendingAwait

__all__ = ["format_journal", "format_pending"]


def format_journal(journal: FunctionJournal | None) -> list[str]:
    """The journal as `show` prints it; no lines for a saga that is not a saga function."""
    if journal is None:
        return []
    n = len(journal.entries)
    lines = ["", f"journal ({n} {'entry' if n == 1 else 'entries'}):"]
    if journal.entries:
        table = text_table(
            ("#", "KIND", "WHAT", "OUTCOME", "ATTEMPTS", "REPLY", "AT"),
            (
                (
                    str(e.seq),
                    e.kind,
                    e.what,
                    e.outcome + (f" ({e.decision})" if e.decision else ""),
                    str(e.attempts),
                    e.reply or "-",
                    e.at.isoformat() if e.at else "-",
                )
                for e in journal.entries
            ),
        )
        lines.extend(f"  {row}" for row in table.splitlines())
    lines.append(f"pending   {format_pending(journal.pending)}")
    if journal.compensating or journal.aborted:
        undoing = "undoing what it did" if journal.compensating else "not undoing"
        lines.append(f"aborted   {undoing}" + (f": {journal.aborted}" if journal.aborted else ""))
    if journal.deadline_at is not None:
        lines.append(f"deadline  {journal.deadline_at.isoformat()} (the saga's own)")
    if journal.late:
        lines.append("late events:")
        lines.extend(f"  {note}" for note in journal.late)
    return lines


def format_pending(p: PendingAwait | None) -> str:
    """The await the function is suspended on, in one line: what, which attempt, until when."""
    if p is None:
        return "nothing"
    line = f"#{p.seq} {p.kind} {p.what}"
    if p.kind in ("call", "undo"):
        line += f", attempt {p.attempt}" + (f" of {p.max_attempts}" if p.max_attempts else "")
    if p.timer_at is not None:
        due = p.timer_at.isoformat()
        if p.backing_off:
            line += f", attempt {p.attempt + 1} due {due}"
        elif p.kind == "sleep":
            line += f", until {due}"
        else:
            line += f", times out {due}"
    if p.kind in ("call", "undo"):
        if p.timeout is not None:
            line += f" ({p.timeout.total_seconds():g} s an attempt)"
        if p.expects:
            line += f", expects {' | '.join(p.expects)}"
    if p.reason:
        line += f": {p.reason}"
    return line
