"""A TCP relay in front of a PostgreSQL server (or PgBouncer) that breaks a client's connection
when a test tells it to, at a point chosen by the statement's text, not by time:

    proxy = WireProxy(upstream_port)         # clients connect to proxy.port instead
    proxy.lose_answer("pgfence.complete(")   # the next such statement runs and commits; its
                                             # answer never arrives: the connection is cut
    ...
    assert proxy.fired.is_set()
    proxy.close()

It reads the protocol's framing only (type byte and length): the startup packet (and an
SSLRequest's one-byte answer) untyped, every later message typed. A statement is the text of a
Parse ('P') or a simple Query ('Q'); its answer ends with the ReadyForQuery ('Z') that answers
the first Sync ('S') or Query sent with or after it, which comes after the transaction of an
autocommitted statement has committed. So "lose the answer" means: forward the statement, drop
what the server says about its execution (see ANSWER) through that ReadyForQuery, then close
both sides. The client sees a broken connection for a statement that did run.
"""

from __future__ import annotations

import socket
import struct
import threading
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


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: WireProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.syncs = 0                        # ReadyForQuerys to come: startup, Syncs, Queries
        self.answers = 0                      # ReadyForQuerys seen from the server
        self.lose: int | None = None          # the ReadyForQuery that ends the lost answer
        self.raw_byte = False                 # the server answers an SSLRequest with one byte
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for s in (self.client, self.server):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                s.close()

    def client_to_server(self) -> None:
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
                        if self.proxy._take(text.decode("utf-8", "replace")):
                            self.lose = self.syncs + 1
                    if kind in (b"S", b"Q"):
                        self.syncs += 1
                    out += message
                if out:
                    self.server.sendall(out)
        except OSError:
            pass
        self.close()

    def server_to_client(self) -> None:
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
                        if out:
                            self.client.sendall(out)
                        self.proxy.fired.set()
                        self.close()          # the answer is lost with the connection
                        return
                if out:
                    self.client.sendall(out)
        except OSError:
            pass
        self.close()


class WireProxy:
    """Listens on a free loopback port (``port``) and relays every connection to
    ``upstream_port``; ``lose_answer`` and ``cut`` break connections on purpose."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((LOOPBACK, 0))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.fired = threading.Event()
        self._pattern: str | None = None
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_answer(self, pattern: str) -> None:
        """The next statement (on any connection) whose text contains ``pattern`` runs; its
        answer is dropped and its connection cut. ``fired`` is set when that happened."""
        with self._lock:
            self._pattern = pattern
            self.fired.clear()

    def cut(self) -> int:
        """Cuts every connection now; how many there were."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
        return len(links)

    def close(self) -> None:
        self._closed = True
        with suppress(OSError):
            self.listener.close()
        self.cut()

    def _take(self, text: str) -> bool:
        with self._lock:
            if self._pattern is not None and self._pattern in text:
                self._pattern = None
                return True
            return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((LOOPBACK, self.upstream_port))
            except OSError:
                client.close()                # upstream down: as if refused
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, server)
            with self._lock:
                self._links = [x for x in self._links if not x.closed.is_set()] + [link]
            threading.Thread(target=link.client_to_server, daemon=True).start()
            threading.Thread(target=link.server_to_client, daemon=True).start()
