"""The control-plane conformance check: runs two replicas of any server implementation (any
language) against one database, and checks over HTTP what docs/control-plane.md's leader recipe
promises. Exit 0 when every step passes, 1 at the first that does not (it says which and why).

    python -m pgfence.conformance --dsn DSN --server 'CMD ... {port} ... {name} ... {ttl}'
        [--resource control-plane] [--write 'POST /jobs {"spec": {"n": "{nonce}"}}']
        [--read 'GET /jobs'] [--ttl 600]

``--server`` starts one replica (split like a shell line, run without a shell, in a process
group of its own): ``{port}`` is where it must listen on 127.0.0.1, ``{name}`` the owner label
its lease must carry, ``{ttl}`` its lease's ttl in seconds, ``{dsn}`` the check's own DSN. The
database must be set up by the server's own setup first (the resource registered, its tables
protected); the check's DSN needs ``pgfence_operator`` and ``pgfence_monitor``. A replica answers:

- ``GET /health``: 200 whenever it is up;
- ``GET /ready``: 200 only while it is the resource's current owner (else any other status);
- the write request: 2xx when the write is committed, anything else when refused; its body
  carries ``{nonce}``, which the server stores;
- the read request: 2xx on every replica, the leader's and a standby's alike, with the nonce of
  every committed write in its body.

The steps: one leader is elected and named by the database; ``/ready`` is 200 there only; the
leader writes and the standby refuses to; the standby serves reads, which show the leader's
write and not the refused one; an operator drains the leader's lease (``pgfence.deprecate``)
and its ``/ready`` turns at once, before its own lease deadline (which the long ``--ttl`` keeps
far ahead) could tell it: only a readiness that asks the database passes; a leader is elected
again; then the leader is frozen (SIGSTOP), drained, and succeeded, and once it resumes, still
within its own deadline, its write is refused and not committed, and its ``/ready`` is not
200. Takeovers are the operator's, not a lease running out, so no step waits for a ttl: each
wait ends as soon as what it waits for has happened, and is bounded for a hung server only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pgfence.connection import connect

__all__ = ["NotConformant", "main", "run"]

HUNG = 300.0      # seconds: a server that has not done what it must by then is hung
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NotConformant(Exception):
    """A step failed: ``step`` names it, the message says what was seen."""

    def __init__(self, step: str, seen: str) -> None:
        super().__init__(f"{step}: {seen}")
        self.step = step


@dataclass(frozen=True)
class Request:
    """One HTTP request of the check's: a method, a path, and a body with ``{nonce}``."""

    method: str
    path: str
    body: str | None

    @classmethod
    def parse(cls, text: str) -> Request:
        method, path, *body = text.split(" ", 2)
        return cls(method.upper(), path, body[0] if body else None)

    def send(self, base: str, nonce: str = "") -> tuple[int, str]:
        data = None if self.body is None else self.body.replace("{nonce}", nonce).encode()
        request = urllib.request.Request(base + self.path, data=data, method=self.method,
                                         headers={"Content-Type": "application/json"})
        try:
            with _HTTP.open(request, timeout=HUNG) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")


@dataclass
class Replica:
    name: str
    base: str
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str) -> int:
        try:
            return Request("GET", path, None).send(self.base)[0]
        except OSError:
            return 0                                  # not answering (yet)

    def freeze(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _replicas(command: str, dsn: str, ttl: float, logs: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for i in range(2):
            port = _free_port()
            name = f"conformance-{i}-{port}"
            argv = [a.format(port=port, name=name, ttl=f"{ttl:g}", dsn=dsn)
                    for a in shlex.split(command)]
            log = logs / f"{name}.log"
            with log.open("wb") as out:
                try:
                    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
                except OSError as e:
                    raise NotConformant("start", f"{shlex.join(argv)}: {e}") from None
            started.append(Replica(name, f"http://127.0.0.1:{port}", proc, log))
        yield started
    finally:
        for r in started:
            if r.proc.poll() is None:
                r.thaw()                              # a frozen process cannot handle SIGTERM
                os.killpg(r.proc.pid, signal.SIGTERM)
        for r in started:
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()


def _wait(step: str, what: str, done: Callable[[], bool], replicas: Sequence[Replica]) -> None:
    deadline = time.monotonic() + HUNG
    while not done():
        for r in replicas:
            if r.proc.poll() is not None:
                raise NotConformant(step, f"{r.name} exited ({r.proc.returncode}) while "
                                          f"waiting for {what}")
        if time.monotonic() > deadline:
            raise NotConformant(step, f"no {what} within {HUNG:g} s")
        time.sleep(0.05)


def run(dsn: str, server: str, resource: str = "control-plane",
        write: str = 'POST /jobs {"spec": {"nonce": "{nonce}"}}', read: str = "GET /jobs",
        ttl: float = 600.0, logs: Path | None = None,
        say: Callable[[str], None] = print) -> None:
    """The check; NotConformant at the first step that fails. ``say`` gets a line per step."""
    writing, reading = Request.parse(write), Request.parse(read)
    logs = logs or Path(os.environ.get("TMPDIR", "/tmp"))

    def owner() -> str | None:
        with connect(dsn, "pgfence-conformance") as conn:
            row = conn.execute("select owner from pgfence.resource_status "
                               "where resource = %s and not stale", (resource,)).fetchone()
        return None if row is None else row[0]

    def leader_of(pair: list[Replica], step: str,
                  among: list[Replica] | None = None) -> tuple[Replica, Replica]:
        """Waits until the database names one of ``among`` (default: the pair) owner and its
        /ready is 200; that one and the other."""
        names = {r.name: r for r in among or pair}
        _wait(step, "leader named by the database and ready",
              lambda: (o := owner()) in names and names[o].get("/ready") == 200, pair)
        lead = names[owner() or ""]
        return lead, next(r for r in pair if r is not lead)

    def writes(r: Replica) -> tuple[bool, str]:
        nonce = f"n-{uuid.uuid4().hex}"
        status, _ = writing.send(r.base, nonce)
        return 200 <= status < 300, nonce

    def shows(r: Replica, step: str) -> str:
        status, body = reading.send(r.base)
        if not 200 <= status < 300:
            raise NotConformant(step, f"the read on {r.name} answered {status}")
        return body

    def passed(step: str, detail: str) -> None:
        say(f"ok   {step}: {detail}")

    def deprecate() -> None:
        with connect(dsn, "pgfence-conformance") as conn:
            conn.execute("select pgfence.deprecate(%s)", (resource,))

    with _replicas(server, dsn, ttl, logs) as pair:
        step = "one leader"
        _wait(step, "answer to /health from both replicas",
              lambda: all(r.get("/health") == 200 for r in pair), pair)
        lead, standby = leader_of(pair, step)
        passed(step, f"{lead.name} leads, {standby.name} stands by")

        step = "/ready only on the owner"
        if (s := standby.get("/ready")) == 200:
            raise NotConformant(step, f"the standby {standby.name} answered 200")
        passed(step, f"200 on {lead.name}, {s} on the standby")

        step = "one writer"
        ok, accepted = writes(lead)
        if not ok:
            raise NotConformant(step, f"the leader {lead.name} refused a write")
        ok, refused = writes(standby)
        if ok:
            raise NotConformant(step, f"the standby {standby.name} accepted a write")
        passed(step, "the leader wrote, the standby refused")

        step = "a standby serves reads"
        body = shows(standby, step)
        if accepted not in body or refused in body:
            raise NotConformant(step, "the standby's read does not show exactly the leader's "
                                      "committed write")
        passed(step, "the standby's read shows the leader's write, not the refused one")

        step = "/ready asks the database"
        deprecate()                  # the lease drained: its holder's deadline is still ahead
        if (s := lead.get("/ready")) == 200:
            raise NotConformant(step, f"{lead.name} answered 200 for a lease the database "
                                      "drained: /ready does not ask the database")
        lead, standby = leader_of(pair, step)
        passed(step, f"503 at once from the drained leader; {lead.name} elected")

        step = "a frozen leader is refused after failover"
        lead.freeze()
        deprecate()
        new, old = leader_of(pair, step, among=[standby])
        ok, fresh = writes(new)
        if not ok:
            raise NotConformant(step, f"the new leader {new.name} refused a write")
        old.thaw()                   # still within its own deadline: it believes it leads
        ok, stale = writes(old)
        if ok:
            raise NotConformant(step, f"the resumed old leader {old.name} accepted a write")
        if (s := old.get("/ready")) == 200:
            raise NotConformant(step, f"the resumed old leader {old.name} answered /ready 200")
        body = shows(new, step)
        if fresh not in body or stale in body:
            raise NotConformant(step, "the resumed old leader's refused write was committed")
        if new.get("/ready") != 200 or old.get("/ready") == 200:
            raise NotConformant(step, "/ready is not 200 on the new leader alone")
        passed(step, f"{old.name}'s /ready and write refused; {new.name} leads")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pgfence.conformance",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dsn", required=True, help="libpq connection string: operator and monitor")
    p.add_argument("--server", required=True,
                   help="the command that starts one replica: {port}, {name}, {ttl}, {dsn}")
    p.add_argument("--resource", default="control-plane")
    p.add_argument("--write", default='POST /jobs {"spec": {"nonce": "{nonce}"}}',
                   help="METHOD PATH [BODY with {nonce}]")
    p.add_argument("--read", default="GET /jobs", help="METHOD PATH")
    p.add_argument("--ttl", type=float, default=600.0,
                   help="the replicas' lease ttl, seconds: long, so that only the database "
                        "can tell a drained leader (default 600)")
    p.add_argument("--logs", type=Path, help="where the replicas' output goes (default TMPDIR)")
    args = p.parse_args(argv)
    try:
        run(args.dsn, args.server, args.resource, args.write, args.read, args.ttl, args.logs)
    except NotConformant as e:
        print(f"FAIL {e}", file=sys.stderr)
        return 1
    print("conformant")
    return 0


if __name__ == "__main__":
    sys.exit(main())
