"""The supervisor's worker processes, the relays in front of some of them, and who is who.

Process workers fill slots (a resource and a route: direct, through a relay, or through
PgBouncer) and are started again when they die. Invocation workers are started for one
``request_start`` and not replaced. Every process is spawned by the fleet's watcher thread:
a worker asks the kernel to kill it when the thread that spawned it ends (PR_SET_PDEATHSIG),
so that thread lives until every worker is gone.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from testkit.relay import Relay
from tests.support import ROOT

from .schedule import Settings

ROUTES = ("direct", "relay", "pgbouncer")


@dataclass
class Slot:
    resource: str
    route: str
    relay: Relay | None = None
    spawned: int = 0
    invocation: uuid.UUID | None = None   # set for an invocation worker's one-off slot


@dataclass
class WorkerProcess:
    name: str
    slot: Slot
    popen: subprocess.Popen[str]
    answers: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True, name=f"answers-{self.name}").start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.answers.put(line.strip())
        self.answers.put(None)                # it exited

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        with suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def tell(self, line: str) -> None:
        assert self.popen.stdin is not None
        with suppress(OSError):
            self.popen.stdin.write(line + "\n")
            self.popen.stdin.flush()

    def forget_answers(self) -> None:
        with suppress(queue.Empty):
            while True:
                if self.answers.get_nowait() is None:
                    self.answers.put(None)   # keep the news that it exited
                    return

    def answer(self, timeout: float) -> str | None:
        """The next answer, or None on timeout or exit."""
        try:
            return self.answers.get(timeout=timeout)
        except queue.Empty:
            return None

    def stopped(self) -> bool:
        """Stopped by a signal (state T in /proc): the worker paused itself."""
        try:
            stat = Path(f"/proc/{self.popen.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class Fleet:
    def __init__(self, s: Settings, dsn: Callable[[int], str], ports: dict[str, int],
                 advisory: bool, log: IO[str]) -> None:
        self.s = s
        self.dsn = dsn                      # port -> dsn
        self.ports = ports                  # direct and pgbouncer; relays pass to direct
        self.advisory = advisory
        self._log = log
        self._lock = threading.Lock()
        self._slots: list[Slot] = []
        self._procs: list[WorkerProcess] = []
        self._requests: queue.Queue[Slot | None] = queue.Queue()
        self._closing = threading.Event()
        self._spawning_done = threading.Event()
        self._gone = threading.Event()
        for r in s.resources:
            for route in ROUTES:
                relay = (Relay(ports["direct"], f"{r}.{route}")
                         if route == "relay" else None)
                self._slots.append(Slot(r, route, relay))
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="fleet")
        self._watcher.start()

    # -- who is who ------------------------------------------------------------------------
    def living(self, resource: str | None = None) -> list[WorkerProcess]:
        with self._lock:
            return sorted((p for p in self._procs if p.alive
                           and (resource is None or p.slot.resource == resource)),
                          key=lambda p: p.name)

    def by_name(self, name: str) -> WorkerProcess | None:
        return next((p for p in self.living() if p.name == name), None)

    def relays(self) -> list[Relay]:
        return [s.relay for s in self._slots if s.relay is not None]

    def relay_of(self, resource: str) -> Relay | None:
        return next((s.relay for s in self._slots if s.resource == resource and s.relay), None)

    # -- starting and stopping -----------------------------------------------------------
    def start_invocation(self, resource: str, invocation: uuid.UUID, route: str) -> None:
        self._requests.put(Slot(resource, route, invocation=invocation))

    def _watch(self) -> None:
        for slot in self._slots:
            self._spawn(slot)
        while not self._closing.is_set():
            with suppress(queue.Empty):
                request = self._requests.get(timeout=0.1)
                if request is not None and not self._closing.is_set():
                    self._spawn(request)
            for slot in self._slots:         # process workers are started again when they die
                if not self._closing.is_set() and not any(
                        p.slot is slot and p.alive for p in self._procs):
                    self._spawn(slot)
        self._spawning_done.set()
        self._gone.wait()                    # see the module's docstring

    def _spawn(self, slot: Slot) -> None:
        slot.spawned += 1
        if slot.invocation is not None:
            name = f"{slot.resource}.inv-{slot.invocation.hex[:6]}.{slot.route}"
        else:
            name = f"{slot.resource}.{slot.route}.{slot.spawned}"
        dsn = self.dsn(slot.relay.port if slot.relay else self.ports[slot.route])
        args = [sys.executable, "-m", "tests.campaign.worker", "--dsn", dsn,
                "--resource", slot.resource, "--queue", self.s.queue, "--name", name,
                "--mode", "advisory" if self.advisory else "pgfence",
                "--ttl", str(self.s.ttl), "--visibility", str(self.s.visibility),
                "--work", str(self.s.work), "--poll", str(self.s.poll),
                "--idle-wait", str(self.s.idle_wait)]
        if slot.invocation is not None:
            args += ["--invocation", str(slot.invocation)]
        popen = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self._log, text=True, bufsize=1)
        with self._lock:
            self._procs.append(WorkerProcess(name, slot, popen))

    def stop(self) -> None:
        """SIGTERM (drain: finish the task in hand, release), then SIGKILL after 5 s."""
        self._closing.set()
        self._requests.put(None)
        self._spawning_done.wait()
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.signal(signal.SIGKILL)
                p.popen.wait()
            if p.popen.stdin is not None:
                with suppress(OSError):
                    p.popen.stdin.close()
        self._gone.set()
        self._watcher.join()
        for relay in self.relays():
            relay.close()
