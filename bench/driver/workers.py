"""The whole cycle through real workers (scripts/bench --only workers): a queue filled with
no-op jobs, then 1 or 4 worker processes, each claiming ``qty`` at a time and finishing what it
claimed, until the queue is empty. The rate is jobs / (the start signal -> the database says
every job is finished). Every system runs once per round, in an order rotated each round; a
ratio is taken per round against the hand-written worker of the same round, then its median and
range reported.

Systems (``SYSTEMS``): the hand-written SKIP LOCKED worker (psycopg: claim qty with one UPDATE,
complete each, as a careful user writes it), pgfence's Python workers (threads and asyncio,
each process with a lease of its own on a resource of its own, all serving the queue), its Deno
workers (clients/deno's Worker and PgmqWorker, run by bench/driver/deno_worker.ts), the pgmq
layer's Python worker and pgmq itself (read qty, archive each). With --peers, procrastinate,
pgqueuer, graphile-worker and pg-boss too, run from the bench-only environment that
bench/peers/setup installs (bench/.peers: never the tests' setup) by bench/peers/run.py and
run.mjs, each with its documented settings.

The pgflow group (scripts/bench --only flows) runs the same way over two flows of one no-op step:
pgflow's own protocol driven by a hand-written worker (psycopg: read qty messages, pgflow's
start_tasks, complete_task each; no pgfence) against the Deno client's FlowWorker on
pgfence's pgflow layer (a start held for the batch, its results in one
pgfence_pgflow.complete_many, statements prepared), ratios per round against the first.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from pgfence.connection import connect
from testkit.cluster import DENO, LOOPBACK

from .report import fmt
from .run import CHILDREN, ROOT, Options, Server, log

QUEUE = "wq"
HUNG = 600  # s: a run still unfinished then is a hung run, not a slow one
SETUP = """
create table if not exists bench.jobs (
  id         bigint generated always as identity primary key,
  payload    jsonb not null,
  state      text not null default 'queued',
  locked_at  timestamptz,
  done_at    timestamptz
);
create index if not exists jobs_queued on bench.jobs (id) where state = 'queued';
select pgmq.create('wq') where not exists (select from pgmq.meta where queue_name = 'wq');
"""
# The hand-written worker: claim with one statement, complete each job with one.
CLAIM_RAW = ("update bench.jobs set state = 'running', locked_at = clock_timestamp() "
             "where id = any (array(select id from bench.jobs where state = 'queued' "
             "order by id limit %s for update skip locked)) returning id, payload")
DONE_RAW = "update bench.jobs set state = 'done', done_at = clock_timestamp() where id = %s"


@dataclass(frozen=True)
class System:
    label: str
    fill: str        # SQL that queues %(n)s jobs (a peer: its runner's "fill")
    clear: str       # SQL that removes them after a run
    left: str        # SQL: the jobs not finished
    runner: tuple[str, ...] = ()   # a peer's: the command of bench/peers/run.py or run.mjs


PGFENCE = System(
    "pgfence",
    "select pgfence.enqueue('wq', jsonb_build_object('n', g)) from generate_series(1, %(n)s) g",
    "delete from pgfence.tasks where queue = 'wq'",
    "select count(*) from pgfence.tasks where queue = 'wq' and state <> 'completed'")
PGMQ = System(
    "pgmq",
    "select pgmq.send_batch('wq', array(select jsonb_build_object('n', g) "
    "from generate_series(1, %(n)s) g))",
    "select pgmq.purge_queue('wq'); truncate pgmq.a_wq",
    "select count(*) from pgmq.q_wq")
RAW = System(
    "raw",
    "insert into bench.jobs (payload) select jsonb_build_object('n', g) "
    "from generate_series(1, %(n)s) g",
    "truncate bench.jobs",
    "select count(*) from bench.jobs where state <> 'done'")

# The pgflow group's flows: wf worked by the FlowWorker, wf_raw by pgflow's own protocol (a
# pgflow.workers row per hand-written worker process, as pgflow's own worker registers).
FLOW_SETUP = """
select pgflow.create_flow(f) from unnest(array['wf', 'wf_raw']) f
 where not exists (select from pgflow.flows where flow_slug = f);
select pgflow.add_step(f, 'only') from unnest(array['wf', 'wf_raw']) f
 where not exists (select from pgflow.steps where flow_slug = f);
"""


def flow_system(flow: str) -> System:
    """A pgflow flow of the group: a run per job, its one task queued with its message."""
    return System(
        flow,
        f"select count(*) from (select pgflow.start_flow('{flow}', jsonb_build_object('n', g)) "
        "from generate_series(1, %(n)s) g) s",
        "truncate pgflow.step_tasks, pgflow.step_states, pgflow.runs, "
        "pgfence_pgflow.stale_results, pgfence_pgflow.attempts, pgfence_pgmq.stale_results, "
        f"pgfence_pgmq.attempts, realtime.stand_in_calls; select pgmq.purge_queue('{flow}'); "
        f"truncate pgmq.a_{flow}",
        f"select count(*) from pgflow.runs where flow_slug = '{flow}' and status <> 'completed'")


FLOW_SYSTEMS: dict[str, tuple[System, bool]] = {
    "pgflow's protocol, hand-written worker (read qty, start_tasks, complete_task each)":
        (flow_system("wf_raw"), False),
    "pgfence Deno FlowWorker": (flow_system("wf"), True),
}

# The Deno client's workers: deno_worker.ts KIND URL QTY INDEX, with the client's import map.
DENO_WORKER = (str(DENO), "run", f"--allow-net={LOOPBACK}", "--allow-env", "--allow-read",
               "--allow-sys", "--config", str(ROOT / "clients/deno/deno.json"),
               str(ROOT / "bench/driver/deno_worker.ts"))
DENO_KINDS = {"pgfence Deno Worker": "Worker", "pgfence Deno PgmqWorker": "PgmqWorker",
              "pgfence Deno FlowWorker": "FlowWorker"}

PEERS_DIR = ROOT / "bench/.peers"
PY_PEER = (str(PEERS_DIR / "venv/bin/python"), str(ROOT / "bench/peers/run.py"))
NODE_PEER = ("node", str(ROOT / "bench/peers/run.mjs"))
PEERS: dict[str, System] = {
    "procrastinate 3.10 (concurrency qty)": System(
        "procrastinate", "", "truncate procrastinate_jobs cascade",
        "select count(*) from procrastinate_jobs where status <> 'succeeded'",
        (*PY_PEER, "procrastinate")),
    "pgqueuer 1.6 (batch_size qty)": System(
        "pgqueuer", "", "truncate pgqueuer, pgqueuer_log",
        "select count(*) from pgqueuer", (*PY_PEER, "pgqueuer")),
    "graphile-worker 0.18 (concurrency qty)": System(
        "graphile-worker", "", "delete from graphile_worker._private_jobs",
        "select count(*) from graphile_worker._private_jobs", (*NODE_PEER, "graphile-worker")),
    "pg-boss 12.38 (batchSize qty)": System(
        "pg-boss", "", "delete from pgboss.job where name = 'bench'",
        "select count(*) from pgboss.job where name = 'bench' and state <> 'completed'",
        (*NODE_PEER, "pg-boss")),
}

# label -> (its tables, whether it is one of pgfence's); the worker code is worker_main's.
SYSTEMS: dict[str, tuple[System, bool]] = {
    "hand-written SKIP LOCKED worker (claim qty, complete each)": (RAW, False),
    "pgfence Python Worker (threads)": (PGFENCE, True),
    "pgfence Python Worker (asyncio)": (PGFENCE, True),
    "pgfence PgmqWorker": (PGMQ, True),
    "pgfence Deno Worker": (PGFENCE, True),
    "pgfence Deno PgmqWorker": (PGMQ, True),
    "pgmq raw (read qty, archive each)": (PGMQ, False),
}


def worker_main(system: str, dsn: str, qty: int, index: int) -> None:
    """One worker process of a run: ready once connected, then on "go" it works the queue
    until it is empty and exits."""
    import pgfence.aio
    import pgfence.client

    def ready() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    def noop(payload: Any, ctx: Any) -> None:
        return None

    async def anoop(payload: Any, ctx: Any) -> None:
        return None

    resource = f"bench-w{index}"
    if system.startswith("hand-written"):
        with connect(dsn, "worker", prepare=None) as conn:
            ready()
            while rows := conn.execute(CLAIM_RAW, (qty,)).fetchall():
                for job_id, _payload in rows:
                    conn.execute(DONE_RAW, (job_id,))
    elif system.startswith("pgflow's protocol"):
        with connect(dsn, "worker", prepare=None) as conn:
            [(worker_id,)] = conn.execute(
                "insert into pgflow.workers (worker_id, queue_name, function_name) "
                "values (gen_random_uuid(), 'wf_raw', 'bench-raw') returning worker_id").fetchall()
            ready()
            while msgs := [m for (m,) in conn.execute(
                    "select msg_id from pgmq.read('wf_raw', 30, %s)", (qty,)).fetchall()]:
                for run_id, step, index in conn.execute(
                        "select run_id, step_slug, task_index from pgflow.start_tasks('wf_raw', "
                        "%s::bigint[], %s)", (msgs, worker_id)).fetchall():
                    conn.execute("select count(*) from pgflow.complete_task(%s, %s, %s, "
                                 "'{}'::jsonb)", (run_id, step, index))
    elif system.startswith("pgmq raw"):
        with connect(dsn, "worker", prepare=None) as conn:
            ready()
            while rows := conn.execute("select msg_id, message from pgmq.read('wq', 30, %s)",
                                       (qty,)).fetchall():
                for msg_id, _message in rows:
                    conn.execute("select pgmq.archive('wq', %s::bigint)", (msg_id,))
    elif system.endswith("(asyncio)"):
        async def run() -> None:
            owner = pgfence.aio.Owner(dsn, resource, ttl=60)
            assert await owner.acquire()
            ready()
            await pgfence.aio.Worker(owner, QUEUE, anoop, qty=qty).run(until_idle=True)
        asyncio.run(run())
    else:
        owner = pgfence.client.Owner(dsn, resource, ttl=60)
        assert owner.acquire()
        cls = pgfence.client.PgmqWorker if "Pgmq" in system else pgfence.client.Worker
        ready()
        cls(owner, QUEUE, noop, qty=qty).run(until_idle=True)


@dataclass(frozen=True)
class Cost:
    """What one run cost per job, over the whole run (the workers' start and leaving included):
    the CPU of the worker processes (user + system), of the server's backends (the workers' and
    the driver's poll's, counted once they exited), the transactions committed (the poll's
    excepted) and the WAL written. Steadier than the rate on a shared machine."""

    client_us: float
    server_us: float
    commits: float
    wal_bytes: float


COUNTERS = ("select xact_commit, pg_current_wal_lsn() from pg_stat_database "
            "where datname = current_database()")
OTHERS = ("select count(*) from pg_stat_activity where datname = current_database() "
          "and backend_type = 'client backend' and pid <> pg_backend_pid()")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Run:
    rates: dict[tuple[str, int, int], list[float]] = field(default_factory=dict)
    costs: dict[tuple[str, int, int], list[Cost]] = field(default_factory=dict)


def timed(server: Server, label: str, system: System, jobs: int, workers: int, qty: int,
          dsn: str) -> tuple[float, Cost]:
    """One run: the queue filled, the workers started and ready, then told to go; timed until
    the database says every job is finished (polled), so that no worker's way of stopping (a
    drain, a release, a peer's shutdown) counts. Then they are stopped. Its rate, and what it
    cost (``Cost``)."""
    url = f"postgres://{server.cluster.env().get('PGUSER', 'postgres')}@127.0.0.1:" \
          f"{server.cluster.port}/bench"
    if system.runner:
        subprocess.run([*system.runner, url, "fill", str(jobs)], check=True, cwd=ROOT,
                       env=server.env, stdout=subprocess.DEVNULL)
        argv = [*system.runner, url, "work", str(qty)]
    else:
        with server.connect("bench") as conn:
            conn.execute(system.fill, {"n": jobs})
        argv = ([*DENO_WORKER, DENO_KINDS[label], url, str(qty)] if label in DENO_KINDS
                else [sys.executable, "-m", "bench.driver", "--worker", label, dsn, str(qty)])
    # The driver's own statements in the window are subtracted from its commits: each one
    # commits a transaction (this connection's, counted when it ends, and the poll's). Three
    # are not counted in the loops: the last of each, and COUNTERS.
    polls = 3
    with server.connect("bench") as conn:
        while conn.execute(OTHERS).fetchone() != (0,):   # the fill's backend counted before
            polls += 1
            time.sleep(0.01)
        commits, lsn = conn.execute(COUNTERS).fetchone() or (0, "0/0")
    server_cpu, client_cpu = server.reaped_cpu(), children_cpu()
    procs = [subprocess.Popen([*argv, str(i)], cwd=ROOT, env=server.env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
             for i in range(workers)]
    CHILDREN.update(procs)
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{label}: a worker did not start")
        with server.connect("bench") as conn:
            started = time.monotonic()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            while (conn.execute(system.left).fetchone() or (0,))[0]:
                polls += 1
                if any(p.poll() not in (None, 0) for p in procs):
                    raise RuntimeError(f"{label}: a worker failed")
                if time.monotonic() - started > HUNG:
                    raise RuntimeError(f"{label}: jobs left after {HUNG} s")
                time.sleep(0.01)
            elapsed = time.monotonic() - started
        # Ours and the drain-mode peers leave by themselves; the others are stopped.
        grace = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(timeout=max(0.0, grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
                p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        CHILDREN.difference_update(procs)
    with server.connect("bench") as conn:
        while conn.execute(OTHERS).fetchone() != (0,):   # every backend of the run has exited
            time.sleep(0.01)
        commits_after, wal = conn.execute(
            "select xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), %s) from pg_stat_database "
            "where datname = current_database()", (lsn,)).fetchone() or (0, 0)
        cost = Cost(1e6 * (children_cpu() - client_cpu) / jobs,
                    1e6 * (server.reaped_cpu() - server_cpu) / jobs,
                    (commits_after - commits - polls) / jobs, float(wal) / jobs)
        conn.execute(system.clear)
    return jobs / elapsed, cost


def workers(opts: Options, server: Server,
            systems: dict[str, tuple[System, bool]] = SYSTEMS,
            setup: str = SETUP) -> dict[str, object]:
    """The rounds over ``systems`` (the first is the baseline of the ratios): the workers
    group's, with --peers its peers too, or the pgflow group's (FLOW_SYSTEMS, FLOW_SETUP)."""
    jobs = 100 if opts.quick else opts.jobs
    chosen = dict(systems)
    if opts.peers and systems is SYSTEMS:
        if not PEERS_DIR.exists():
            raise RuntimeError("the peers' environment is missing: run bench/peers/setup")
        chosen |= {label: (system, False) for label, system in PEERS.items()}
    server.sql("bench", setup)
    for i in range(4):
        server.sql("bench", "select pgfence.register(%s)", f"bench-w{i}")
    dsn = server.cluster.tcp_dsn("bench")
    run = Run()
    labels = list(chosen)
    for rnd in range(opts.rounds):
        order = labels[rnd % len(labels):] + labels[:rnd % len(labels)]
        for n_workers in (1, 4):
            for qty in (1, 10):
                for label in order:
                    rate, cost = timed(server, label, chosen[label][0], jobs, n_workers, qty,
                                       dsn)
                    run.rates.setdefault((label, n_workers, qty), []).append(rate)
                    run.costs.setdefault((label, n_workers, qty), []).append(cost)
                    log(f"  round {rnd + 1}, {n_workers} worker(s), qty {qty}: {label}: "
                        f"{rate:,.0f} jobs/s")
    return {"jobs": jobs, "rounds": opts.rounds, "rates": run.rates, "costs": run.costs,
            "labels": labels}


def workers_report(w: dict[str, object]) -> list[str]:
    rates: dict[tuple[str, int, int], list[float]] = w["rates"]  # type: ignore[assignment]
    labels: list[str] = w["labels"]  # type: ignore[assignment]
    baseline = labels[0]
    lines = [
        f"{w['jobs']:,} no-op jobs per run, {w['rounds']} rounds; jobs/s from the start signal "
        "until the database says every job is finished, median over rounds (min-max); the "
        f"ratio to the {baseline} is taken per round (median, min-max).",
        "",
        "| system | workers | qty | jobs/s | rounds | ratio to hand-written | per round |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for label in labels:
        for n_workers in (1, 4):
            for qty in (1, 10):
                r = rates[label, n_workers, qty]
                base = rates[baseline, n_workers, qty]
                ratios = [a / b for a, b in zip(r, base, strict=True)]
                lines.append(
                    f"| {label} | {n_workers} | {qty} | {fmt(statistics.median(r))} | "
                    f"{fmt(min(r))}-{fmt(max(r))} | {statistics.median(ratios):.2f} | "
                    f"{min(ratios):.2f}-{max(ratios):.2f} |")
    costs: dict[tuple[str, int, int], list[Cost]] = w["costs"]  # type: ignore[assignment]
    lines += [
        "",
        "Cost per job, median over rounds: CPU of the worker processes and of the server's "
        "backends (the driver's poll's too), transactions committed (the poll's excepted), "
        "WAL written; the whole run, the workers' start and leaving included.",
        "",
        "| system | workers | qty | client CPU µs | server CPU µs | commits | WAL bytes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        for n_workers in (1, 4):
            for qty in (1, 10):
                c = costs[label, n_workers, qty]
                lines.append(
                    f"| {label} | {n_workers} | {qty} | "
                    f"{fmt(statistics.median(x.client_us for x in c))} | "
                    f"{fmt(statistics.median(x.server_us for x in c))} | "
                    f"{statistics.median(x.commits for x in c):.2f} | "
                    f"{fmt(statistics.median(x.wal_bytes for x in c))} |")
    return lines
