"""The outbox relay's settings: how much it sends per round, how it waits and gives up."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field

from processor.settings._values import Duration

__all__ = ["RelaySettings"]


class RelaySettings(BaseModel):
    """The outbox relay: how much it sends per round and how it waits for work."""

    # Each replica publishes the outbox rows of the input partitions it owns: a replica with
    # its relay off leaves those rows unpublished until its partitions move.
    enabled: bool = True
    batch_size: int = Field(default=1000, ge=1)
    # And at most this many bytes of keys and values per round (a larger row goes alone): the
    # bound on what a round holds in memory. Dead letters keep whole input records, so a relay
    # behind on a thousand 2 MB dead letters would otherwise load 2 GB at once.
    max_batch_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # The relay is woken in-process after each commit and by NOTIFY from other processes;
    # this is only the fallback.
    poll_interval: Duration = timedelta(seconds=1)
    # How long one round waits for the broker's acknowledgements before giving up (the rows
    # stay in the outbox). A round idle in its transaction for twice this is presumed frozen
    # or cut off, and the server ends it: until then it holds the relay lock of the rows of no
    # partition, and its own partitions' offsets rows (a new owner's claim of them waits).
    flush_timeout: Duration = timedelta(seconds=15)
    # Rounds a row may fail with the same kind of transient error (while other rows go through)
    # before it is set aside in the failed outbox, with its saga's later rows held behind it.
    max_attempts: int = Field(default=10, ge=1)
    # Largest record the relay sends: the producer's message.max.bytes. A larger command is set
    # aside unsent; a larger dead letter is sent with its value cut (the stored row keeps it).
    max_record_bytes: int = Field(default=1_000_000, ge=1024)
