"""A small TCP relay between one client and its server (PostgreSQL or PgBouncer), for the fault
campaign and the client's fault tests.

Three faults, on every connection through the relay:

- drop: the next client message that contains a pattern (``b"COMMIT"``, ``b"pgfence.renew"``)
  is forwarded; the server's answer is swallowed and both sides are closed. The server did
  the work, the client never learns it: a lost response.
- before: the next client message that contains a pattern is held while an action runs (it
  terminates the backend behind the connection, restarts PgBouncer, moves time on), then
  forwarded. A kill before the server saw the statement, at an exact step, with no sleep.
- partition: nothing is forwarded either way until ``heal()``; then what was held is
  delivered, as TCP would once a partition heals. A request can reach the server long after
  it was sent.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from contextlib import suppress


class Relay:
    def __init__(self, upstream: tuple[str, int], name: str) -> None:
        self.name = name
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()       # cleared during a partition
        self._open.set()
        self._lock = threading.Lock()
        self._pattern: bytes | None = None
        self._before: Callable[[Link], None] | None = None
        self.dropped = threading.Event()     # an answer was lost since the last arm()
        self.fired = threading.Event()       # the armed fault fired (either kind): its
        #                                      ``before`` action has returned
        self.errors: list[BaseException] = []    # raised by a ``before`` action
        self._links: set[Link] = set()
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{name}").start()

    def arm(self, pattern: bytes, before: Callable[[Link], None] | None = None) -> None:
        """Loses the answer to the next client message containing ``pattern``; or, with
        ``before``, holds that message while ``before(link)`` runs, then forwards it."""
        with self._lock:
            self.dropped.clear()
            self.fired.clear()
            self._pattern = pattern
            self._before = before

    def disarm(self) -> None:
        with self._lock:
            self._pattern = None
            self._before = None

    def partition(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone may not.
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._open.set()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def _take(self, data: bytes) -> tuple[bool, Callable[[Link], None] | None]:
        """Whether ``data`` fires the armed fault, and its action if it has one."""
        with self._lock:
            if self._pattern is not None and self._pattern in data:
                self._pattern = None
                before, self._before = self._before, None
                return True, before
            return False, None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return                       # closed
            try:
                server = socket.create_connection(self._upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()               # the server is down: the client sees a reset
                continue
            link = Link(self, client, server)
            with self._lock:
                self._links.add(link)
            link.start()

    def _forget(self, link: Link) -> None:
        with self._lock:
            self._links.discard(link)


class Link:
    """One client connection and its server connection, pumped by two threads."""

    def __init__(self, relay: Relay, client: socket.socket, server: socket.socket) -> None:
        self.relay = relay
        self.client = client
        self.server = server
        self.drop_answer = False
        # The relay's end towards the server: what PostgreSQL shows as the backend's
        # client_port (pg_stat_activity), when the server is PostgreSQL itself.
        self.upstream_port: int = server.getsockname()[1]

    def start(self) -> None:
        for src, dst, upstream in ((self.client, self.server, True),
                                   (self.server, self.client, False)):
            threading.Thread(target=self._pump, args=(src, dst, upstream), daemon=True,
                             name=f"relay-{self.relay.name}-{'up' if upstream else 'down'}").start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                self.relay._open.wait()          # a partition holds the data until heal()
                if upstream:
                    fired, before = self.relay._take(data)
                    if fired and before is not None:
                        try:
                            before(self)         # the server has not seen the message yet
                        except BaseException as e:   # for the test to see, not this thread
                            self.relay.errors.append(e)
                        self.relay.fired.set()
                    elif fired:
                        self.drop_answer = True  # set before the server can answer
                elif self.drop_answer:
                    self.relay.dropped.set()
                    self.relay.fired.set()
                    break                        # the answer is lost with the connection
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        for s in (self.client, self.server):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.relay._forget(self)
