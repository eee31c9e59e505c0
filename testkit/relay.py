"""The one fault relay: a TCP relay between clients and their server (PostgreSQL or PgBouncer)
that breaks a connection at a point chosen by a statement's text, never by time. The fault
campaign, the Python client's fault tests and the Deno client's use it.

    relay = Relay(upstream_port, "r1")       # clients connect to relay.port instead
    relay.arm("pgfence.complete(")           # the next such statement runs and commits; its
                                             # answer never arrives: the connection is cut
    relay.arm("COMMIT", before=kill)         # or: it is held while kill(link) runs, then sent
    relay.partition(); ...; relay.heal()     # nothing passes either way until heal()
    relay.cut()                              # every connection closed now

It reads the protocol's framing only (type byte and length): the startup packet (and an
SSLRequest's one-byte answer) untyped, every later message typed. A statement is the text of a
Parse ('P') or a simple Query ('Q'). Its answer ends with the ReadyForQuery ('Z') that answers
the first Sync ('S') or Query sent with or after it, which comes after the transaction of an
autocommitted statement has committed. So a lost answer is: the statement forwarded, what the
server says about its execution (``ANSWER``) dropped through that ReadyForQuery, then both sides
closed. The client sees a broken connection for a statement that did run.

- ``dropped`` is set when an answer was lost; ``fired`` when the armed fault fired (a lost
  answer, or a ``before`` action that returned); ``errors`` holds what a ``before`` action
  raised, for the test to see.
- A partition holds everything until ``heal()``, then delivers it, as TCP would once a
  partition heals: a request can reach the server long after it was sent.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from contextlib import suppress

from testkit.cluster import LOOPBACK

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
# What a lost answer loses: the execution's messages (BindComplete, DataRow, CommandComplete,
# EmptyQueryResponse, PortalSuspended, ErrorResponse) and the ReadyForQuery. The statement's
# description (ParseComplete, ParameterDescription, RowDescription, NoData) still reaches the
# client, which asks for it first (Parse, Describe, Flush) when it must learn parameter types
# (postgres.js without prepared statements), and only then sends the Bind, Execute and Sync
# that run the statement.
ANSWER = {b"2", b"D", b"C", b"I", b"s", b"E", b"Z"}


class Relay:
    """Listens on a free loopback port (``port``) and relays every connection to
    ``upstream_port`` on the loopback address."""

    def __init__(self, upstream_port: int, name: str = "relay") -> None:
        self.name = name
        self.upstream_port = upstream_port
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()       # cleared during a partition
        self._open.set()
        self._lock = threading.Lock()
        self._pattern: str | None = None
        self._before: Callable[[Link], None] | None = None
        self.dropped = threading.Event()     # an answer was lost since the last arm()
        self.fired = threading.Event()       # the armed fault fired (either kind)
        self.errors: list[BaseException] = []    # raised by a ``before`` action
        self._links: set[Link] = set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{name}").start()

    def arm(self, pattern: str, before: Callable[[Link], None] | None = None) -> None:
        """Loses the answer to the next statement (on any connection) whose text contains
        ``pattern``; or, with ``before``, holds that statement while ``before(link)`` runs,
        then forwards it."""
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

    def cut(self) -> int:
        """Closes every connection now; how many there were."""
        with self._lock:
            links, self._links = list(self._links), set()
        for link in links:
            link.close()
        return len(links)

    def close(self) -> None:
        self._closed = True
        # shutdown() wakes the thread blocked in accept(); close() alone may not.
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._open.set()
        self.cut()

    def _take(self, text: str) -> tuple[bool, Callable[[Link], None] | None]:
        """Whether a statement of ``text`` fires the armed fault, and its action if it has one."""
        with self._lock:
            if self._pattern is not None and self._pattern in text:
                self._pattern = None
                before, self._before = self._before, None
                return True, before
            return False, None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return                       # closed
            try:
                server = socket.create_connection((LOOPBACK, self.upstream_port), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()               # the server is down: the client sees a reset
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
        # The relay's end towards the server: what PostgreSQL shows as the backend's
        # client_port (pg_stat_activity), when the server is PostgreSQL itself.
        self.upstream_port: int = server.getsockname()[1]
        self.syncs = 0                        # ReadyForQuerys to come: startup, Syncs, Queries
        self.answers = 0                      # ReadyForQuerys seen from the server
        self.lose: int | None = None          # the ReadyForQuery that ends the lost answer
        self.raw_byte = False                 # the server answers an SSLRequest with one byte
        self.closed = threading.Event()

    def start(self) -> None:
        for pump in (self._client_to_server, self._server_to_client):
            threading.Thread(target=pump, daemon=True,
                             name=f"relay-{self.relay.name}-{pump.__name__}").start()

    def close(self) -> None:
        self.closed.set()
        for s in (self.client, self.server):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                s.close()
        self.relay._forget(self)

    def _send(self, to: socket.socket, data: bytes) -> None:
        if data:
            self.relay._open.wait()           # a partition holds the data until heal()
            to.sendall(data)

    def _client_to_server(self) -> None:
        buf = b""
        startup = True
        try:
            while not self.closed.is_set():
                chunk = self.client.recv(65536)
                if not chunk:
                    break
                buf += chunk
                out = b""
                while True:
                    if startup:
                        if len(buf) < 8:
                            break
                        length = struct.unpack("!I", buf[:4])[0]
                        if len(buf) < length:
                            break
                        code = struct.unpack("!I", buf[4:8])[0]
                        out += buf[:length]
                        buf = buf[length:]
                        if code in (SSL_REQUEST, GSSENC_REQUEST):
                            self.raw_byte = True  # another untyped packet follows
                        else:
                            startup = False
                            self.syncs += 1       # the startup ends with a ReadyForQuery too
                        continue
                    if len(buf) < 5:
                        break
                    kind = buf[:1]
                    length = struct.unpack("!I", buf[1:5])[0]
                    if len(buf) < 1 + length:
                        break
                    message, buf = buf[:1 + length], buf[1 + length:]
                    if kind in (b"P", b"Q") and self.lose is None:
                        body = message[5:]
                        text = body.split(b"\0")[1 if kind == b"P" else 0]
                        fired, before = self.relay._take(text.decode("utf-8", "replace"))
                        if fired and before is not None:
                            self._send(self.server, out)
                            out = b""
                            try:
                                before(self)          # the server has not seen it yet
                            except BaseException as e:  # for the test to see, not this thread
                                self.relay.errors.append(e)
                            self.relay.fired.set()
                        elif fired:
                            self.lose = self.syncs + 1
                    if kind in (b"S", b"Q"):
                        self.syncs += 1
                    out += message
                self._send(self.server, out)
        except OSError:
            pass
        self.close()

    def _server_to_client(self) -> None:
        buf = b""
        try:
            while not self.closed.is_set():
                chunk = self.server.recv(65536)
                if not chunk:
                    break
                buf += chunk
                out = b""
                if self.raw_byte and buf:
                    out, buf = buf[:1], buf[1:]
                    self.raw_byte = False
                while len(buf) >= 5:
                    kind = buf[:1]
                    length = struct.unpack("!I", buf[1:5])[0]
                    if len(buf) < 1 + length:
                        break
                    message, buf = buf[:1 + length], buf[1 + length:]
                    losing = self.lose is not None and self.answers >= self.lose - 1
                    if kind == b"Z":
                        self.answers += 1
                    if not losing or kind not in ANSWER:
                        out += message
                    elif kind == b"Z" and self.answers == self.lose:
                        self._send(self.client, out)
                        self.relay.dropped.set()
                        self.relay.fired.set()
                        self.close()          # the answer is lost with the connection
                        return
                self._send(self.client, out)
        except OSError:
            pass
        self.close()
