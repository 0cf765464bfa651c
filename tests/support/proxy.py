"""A TCP proxy on loopback that can black-hole traffic or cut connections after a COMMIT.

It stands between one processor and PostgreSQL, so a test can take the database away from that
replica alone, the way a network partition does: a black hole keeps every socket open and just
stops moving bytes (nothing errors, nothing answers), and healing moves the held bytes on, or,
for a partition that drops packets, ends every connection that lived through it: their bytes
are lost, and a peer's TCP user timeout and keepalives would have ended them by then.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from dataclasses import dataclass, field

_CHUNK = 65536


@dataclass
class _Pair:
    client: socket.socket
    upstream: socket.socket
    # Everything the client sent on this connection since its last COMMIT, for the cut rule.
    since_commit: bytearray = field(default_factory=bytearray)


class Proxy:
    """Forwards 127.0.0.1:<port> to ``target``; see :meth:`black_hole` and :meth:`cut_commits`.

    ``port`` 0 takes any free port (see :attr:`port`).
    """

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._holding = threading.Event()
        self._dropping = False
        self._stopped = threading.Event()
        self._cuts_left = 0
        self._cut_when: tuple[bytes, ...] = ()
        self.cut = 0
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def black_hole(self, *, drop: bool = False) -> None:
        """Stops moving bytes in both directions; connections stay open and new ones hang.

        With ``drop``, the bytes are lost rather than held: see :meth:`heal`.
        """
        self._dropping = drop
        self._holding.set()

    def heal(self) -> None:
        """Moves bytes again: the held ones first, or, after a dropping black hole, on new
        connections only (the ones that lived through it are closed)."""
        if self._dropping:
            with self._lock:
                pairs = list(self._pairs)
            for pair in pairs:
                self._drop(pair)
        self._holding.clear()

    def cut_commits(self, count: int, *, after: tuple[bytes, ...] = ()) -> None:
        """Closes the next ``count`` connections right after forwarding their COMMIT.

        Only a transaction whose statements contained every byte string in ``after`` counts,
        so a test can aim at one kind of transaction (e.g. a consumer's batch).
        """
        with self._lock:
            self._cuts_left = count
            self._cut_when = after

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(5)
        # _drop takes the lock itself (it is not reentrant).
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._drop(pair)
        self._listener.close()
        self._selector.close()

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self._holding.is_set():
                self._stopped.wait(0.05)
                continue
            for key, _ in self._selector.select(timeout=0.05):
                if key.data is None:
                    self._accept()
                else:
                    pair, inbound = key.data
                    self._forward(pair, inbound)

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        try:
            upstream = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        pair = _Pair(client, upstream)
        with self._lock:
            self._pairs.append(pair)
        self._selector.register(client, selectors.EVENT_READ, (pair, True))
        self._selector.register(upstream, selectors.EVENT_READ, (pair, False))

    def _forward(self, pair: _Pair, inbound: bool) -> None:
        source, sink = (pair.client, pair.upstream) if inbound else (pair.upstream, pair.client)
        try:
            data = source.recv(_CHUNK)
        except OSError:
            data = b""
        if not data:
            self._drop(pair)
            return
        try:
            sink.sendall(data)
        except OSError:
            self._drop(pair)
            return
        if inbound and self._should_cut(pair, data):
            self._drop(pair)

    def _should_cut(self, pair: _Pair, data: bytes) -> bool:
        pair.since_commit += data
        if b"COMMIT" not in data:
            return False
        seen, pair.since_commit = bytes(pair.since_commit), bytearray()
        with self._lock:
            if self._cuts_left <= 0 or not all(s in seen for s in self._cut_when):
                return False
            self._cuts_left -= 1
            self.cut += 1
            return True

    def _drop(self, pair: _Pair) -> None:
        for sock in (pair.client, pair.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            with contextlib.suppress(OSError):
                sock.close()
        with self._lock, contextlib.suppress(ValueError):
            self._pairs.remove(pair)
