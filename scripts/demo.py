"""The live demo (run by scripts/demo on its throwaway cluster).

A supervisor starts worker A through the startup handshake. A sends emails from a queue, each
write fenced. The supervisor freezes A (SIGSTOP) in the middle of a task; A's lease runs out;
the supervisor's next tick starts worker B, which takes over with the next generation. Then A
is resumed and carries on as if nothing happened: the database refuses it. At the end: a
timeline of what each process tried and what the database allowed, and the tables.

    python scripts/demo.py DSN                  # the supervisor
    python scripts/demo.py DSN worker NAME INVOCATION   # a worker (started by the supervisor)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import psycopg

from pgfence.client import Context, LeaseLost, Owner, Worker, reason
from pgfence.connection import connect

TTL, VISIBILITY = 2.0, 3.0
# One origin for every process's timeline (wall clock: this only narrates, it decides nothing).
START = float(os.environ.setdefault("PGFENCE_DEMO_START", str(time.time())))
AS_JSON = False          # workers print JSON lines for the supervisor to collect


def log(who: str, what: str) -> None:
    line = {"t": round(time.time() - START, 2), "who": who, "what": what}
    if AS_JSON:
        print(json.dumps(line), flush=True)
    else:
        print_line(line)


def worker(dsn: str, name: str, invocation: str) -> None:
    owner = Owner(dsn, "mailer", owner=name, ttl=TTL)
    if not owner.acquire(uuid.UUID(invocation)):
        log(name, "acquire: another owner is current; exiting")
        return
    log(name, f"acquired the lease: generation {owner.generation}")
    conn = connect(dsn, name)

    def send(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        log(name, f"claimed email {payload['n']} (task {ctx.task.task_id}, attempt "
                  f"{ctx.task.attempt}); rendering it")
        time.sleep(0.4)
        # Fence and write in one transaction. No local clock is consulted here on purpose:
        # the database alone decides whether this process still owns the resource.
        try:
            with conn.transaction():
                generation = conn.execute("select pgfence.fence(%s)",
                                          (owner.lease_id,)).fetchone()
                conn.execute("insert into sent_emails (n, sent_by, generation) "
                             "values (%s, %s, %s)",
                             (payload["n"], name, generation[0] if generation else None))
        except psycopg.Error as e:
            # The message names the lease by id: a capability, kept out of the log.
            log(name, f"write of email {payload['n']} REFUSED: {reason(e)}")
            raise LeaseLost(f"{owner.describe()}: fence refused") from None
        log(name, f"wrote email {payload['n']} under generation {owner.generation}")
        return {"sent": True}

    w = Worker(owner, "emails", send, visibility=VISIBILITY, idle_wait=0.2)
    w.install_sigterm()
    try:
        w.run()
    except LeaseLost:
        log(name, "stops: ownership lost")
    log(name, "exited")


def supervisor(dsn: str) -> None:
    db = connect(dsn, "supervisor")
    db.execute("select pgfence.register('mailer')")
    db.execute("create table sent_emails (n int, sent_by text, generation bigint)")
    db.execute("select pgfence.protect('sent_emails', 'mailer')")
    for n in range(1, 9):
        db.execute("select pgfence.enqueue('emails', %s)", (json.dumps({"n": n}),))
    lines: list[dict[str, Any]] = []
    procs: dict[str, subprocess.Popen[str]] = {}

    def start(name: str) -> bool:
        row = db.execute("select pgfence.request_start('mailer')").fetchone()
        if row is None or row[0] is None:
            log("supervisor", "tick: a worker is current or starting; nothing to start")
            return False
        log("supervisor", f"tick: nobody owns mailer; starting worker {name}")
        p = subprocess.Popen([sys.executable, __file__, dsn, "worker", name, str(row[0])],
                             stdout=subprocess.PIPE, text=True)
        procs[name] = p
        threading.Thread(target=collect, args=(p,), daemon=True).start()
        return True

    def collect(p: subprocess.Popen[str]) -> None:
        for raw in p.stdout or []:
            lines.append(json.loads(raw))
            print_line(lines[-1])

    def wait_for(text: str, deadline: float = 30) -> None:
        end = time.monotonic() + deadline
        while not any(text in x["what"] for x in lines):
            if time.monotonic() > end:
                raise SystemExit(f"demo: gave up waiting for {text!r}")
            time.sleep(0.05)

    start("A")
    wait_for("claimed email 4")
    os.kill(procs["A"].pid, signal.SIGSTOP)
    log("supervisor", "A is frozen mid-task (SIGSTOP: a GC pause, a stuck VM, a partition)")
    while not start("B"):                         # A's lease runs out first
        time.sleep(0.5)
    end = time.monotonic() + 30
    while not any(x["who"] == "B" and "acquired" in x["what"] for x in lines):
        if time.monotonic() > end:
            raise SystemExit("demo: B did not start")
        time.sleep(0.05)
    time.sleep(1.5)                               # B gets to work; A is still frozen
    os.kill(procs["A"].pid, signal.SIGCONT)
    log("supervisor", "A is resumed; it does not know it was frozen")
    procs["A"].wait(timeout=30)
    wait_for_done(db)
    procs["B"].send_signal(signal.SIGTERM)
    log("supervisor", "all emails sent; SIGTERM to B (drain and release)")
    procs["B"].wait(timeout=30)
    time.sleep(0.2)

    print("\n== sent_emails: every row written under the generation that owned it")
    show(db, "select n, sent_by, generation from sent_emails order by n")
    print("\n== pgfence.lease_status")
    show(db, "select generation, owner, status, tasks_held from pgfence.lease_status "
             "order by generation")
    print("\n== pgfence.queue_status")
    show(db, "select queue, queued, claimed, completed, failed, stale_results "
             "from pgfence.queue_status")
    print("\n== pgfence.stale_results (results refused because a newer attempt held the task)")
    show(db, "select task_id, attempt, kind from pgfence.stale_results")


def wait_for_done(db: psycopg.Connection[Any]) -> None:
    end = time.monotonic() + 60
    while db.execute("select count(*) from pgfence.tasks where state <> 'completed'"
                     ).fetchone() != (0,):
        if time.monotonic() > end:
            raise SystemExit("demo: tasks did not finish")
        time.sleep(0.2)


def print_line(line: dict[str, Any]) -> None:
    print(f"{line['t']:6.2f}s  {line['who']:<10} {line['what']}", flush=True)


def show(db: psycopg.Connection[Any], query: str) -> None:
    cur = db.execute(query)
    cols = [c.name for c in cur.description or []]
    rows = [[("" if v is None else str(v)) for v in r] for r in cur.fetchall()]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    if not rows:
        print("(none)")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[2] == "worker":
        AS_JSON = True
        worker(sys.argv[1], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 2:
        supervisor(sys.argv[1])
    else:
        raise SystemExit(__doc__)
