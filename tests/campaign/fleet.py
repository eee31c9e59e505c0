"""The supervisor's worker processes, the relays in front of some of them, and who is who.

Process workers fill slots (a resource and a route: direct, through a relay, or through
PgBouncer) and are started again when they die. Invocation workers are started for one
``request_start`` and not replaced. Every process is spawned by the fleet's watcher thread:
a worker asks the kernel to kill it when the thread that spawned it ends (PR_SET_PDEATHSIG),
so that thread lives until every worker is gone.

The layers' fleet (Settings.fleet "layers") has invocation workers only, all through
PgBouncer: for the pgmq layer's resource a Python worker process, for the pgflow layer's an
Edge isolate, a Deno process of clients/deno/testdata/campaign_flow.ts (``FlowWorker.serve`` in
the stand-in of the Edge Runtime, edge_runtime.ts), booted for one invocation and then sent the
HTTP request that starts the function, as ``ensure_workers`` sends it. Its lease's owner is
``edge-<SB_EXECUTION_ID>``, the name the fleet gives it.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from testkit.cluster import LOOPBACK
from testkit.relay import Relay
from tests.support import DENO, DENO_PERMISSIONS, ROOT

from .schedule import FLOW, LAYERS, Settings

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


# What the Edge isolates' requests are authenticated with (FlowWorker.serve checks it as pgflow
# does).
SERVICE_ROLE_KEY = "campaign-service-role-key"
CLIENT = ROOT / "clients/deno"


class Fleet:
    def __init__(self, s: Settings, dsn: Callable[[int], str], ports: dict[str, int],
                 advisory: bool, log: IO[str], url: Callable[[int, str], str],
                 deno_dir: Path) -> None:
        self.s = s
        self.dsn = dsn                      # port -> dsn
        self.url = url                      # port, application_name -> postgres.js URL
        self.deno_dir = deno_dir
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
        for r in s.resources if s.fleet == "core" else ():
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
        if slot.invocation is not None and self.layer(slot.resource) == "pgflow":
            self._boot_isolate(slot, slot.invocation)
            return
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
                "--idle-wait", str(self.s.idle_wait), "--qty", str(self.s.qty)]
        if slot.invocation is not None:
            args += ["--invocation", str(slot.invocation)]
        if self.layer(slot.resource) == "pgmq":
            args += ["--layer", "pgmq"]
        popen = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self._log, text=True, bufsize=1)
        with self._lock:
            self._procs.append(WorkerProcess(name, slot, popen))

    def layer(self, resource: str) -> str:
        """What the resource's workers work: "core", "pgmq" or "pgflow"."""
        return LAYERS[resource] if self.s.fleet == "layers" else "core"

    def _boot_isolate(self, slot: Slot, invocation: uuid.UUID) -> None:
        """An Edge isolate for one invocation: booted, then sent the request that starts the
        function (by a thread of its own, so that the watcher goes on)."""
        s = self.s
        execution = f"{slot.resource}.{invocation.hex[:6]}"
        name = f"edge-{execution}"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "DENO_DIR": str(self.deno_dir),
               "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1",
               "EDGE_WORKER_DB_URL": self.url(self.ports[slot.route], name),
               "SUPABASE_SERVICE_ROLE_KEY": SERVICE_ROLE_KEY, "SB_EXECUTION_ID": execution,
               "HOST": LOOPBACK, "PORT": "0", "RESOURCE": slot.resource, "FLOW": FLOW,
               "FLOW_TIMEOUT": str(s.flow_timeout), "MAX_ATTEMPTS": str(s.max_attempts),
               "WORK": str(s.work), "TTL": str(s.ttl), "IDLE_WAIT": str(s.idle_wait),
               "EDGE_BEFOREUNLOAD": str(s.beforeunload),
               "EDGE_WALL_CLOCK": str(s.wall_clock * s.patience)}
        # setpriv: a Deno process cannot ask for PR_SET_PDEATHSIG itself (see the docstring).
        popen = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", str(DENO), "run", *DENO_PERMISSIONS,
             "testdata/campaign_flow.ts"], cwd=CLIENT, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        p = WorkerProcess(name, slot, popen)
        with self._lock:
            self._procs.append(p)
        threading.Thread(target=self._request, args=(p, invocation), daemon=True,
                         name=f"request-{name}").start()

    def _request(self, p: WorkerProcess, invocation: uuid.UUID) -> None:
        """The HTTP request that starts the function, once the isolate listens."""
        said = p.answer(timeout=30.0 * self.s.patience)
        if said is None or not said.startswith("listening "):
            self._note(f"{p.name}: never listened ({said!r})")
            return
        request = urllib.request.Request(
            f"http://{LOOPBACK}:{said.split()[1]}/{p.slot.resource}",
            json.dumps({"invocation_id": str(invocation)}).encode(),
            {"content-type": "application/json",
             "authorization": f"Bearer {SERVICE_ROLE_KEY}"})
        try:
            with urllib.request.urlopen(request, timeout=60.0 * self.s.patience) as answer:
                self._note(f"{p.name}: {answer.status} {answer.read().decode().strip()}")
        except urllib.error.HTTPError as e:
            self._note(f"{p.name}: {e.code} {e.read().decode().strip()}")
        except OSError as e:             # the isolate died meanwhile (a kill, a crash)
            self._note(f"{p.name}: no answer ({type(e).__name__})")

    def _note(self, line: str) -> None:
        self._log.write(f"{time.strftime('%H:%M:%S')} fleet: {line}\n")
        self._log.flush()

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
