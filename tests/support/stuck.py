"""A native call that never returns and keeps the interpreter lock: a client library stuck.

confluent-kafka holds the GIL through some calls into librdkafka (``incremental_unassign`` in a
revocation callback among them) that can wait for ever on a broker that is gone. This does the
same on purpose, so a test can show that such a process still ends in time.
"""

from __future__ import annotations

import ctypes
import sys


def hold_the_interpreter() -> None:
    """Blocks the calling thread for ever inside a native call that keeps the GIL.

    No other Python thread runs again and no signal handler either: only a native watchdog
    (faulthandler's) or the kernel ends the process.
    """
    print("fault: holding the interpreter lock for ever", file=sys.stderr, flush=True)
    # PyDLL: the call keeps the GIL (CDLL would release it).
    libc = ctypes.PyDLL(None)
    # Zeroed memory is PTHREAD_MUTEX_INITIALIZER on glibc (the type's 40 bytes fit in 64).
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    # A default mutex locked again by its owner waits for ever, and signals do not end it.
    libc.pthread_mutex_lock(mutex)
