"""The properties over time, each measured and then reported: renewals (HOT updates, table
growth), takeover latency after an owner is killed, and claim throughput with a completed
history. A new property is a function here that measures, one that reports, and a section in
__main__.main."""

from __future__ import annotations

import math
import random
import re
import statistics
import subprocess
import sys
import threading
import time

import psycopg

from pgfence.connection import Connection, connect

from .report import fmt
from .run import BENCH, CHILDREN, CLIENTS, ROOT, Options, Server, log, percentile, pgbench


def renewals(opts: Options, server: Server) -> dict[str, float]:
    first, total = (1_000, 20_000) if opts.quick else (10_000, 1_000_000)
    db = "renewal"
    server.createdb(db)
    server.psql(db, BENCH / "setup_renewal.sql")
    server.sql(
        db, "select pg_stat_reset_single_table_counters('pgfence.leases'::regclass)"
    )

    def snapshot() -> dict[str, float]:
        with server.connect(db) as conn:
            row = conn.execute(
                "select n_tup_upd, n_tup_hot_upd, n_dead_tup, autovacuum_count,"
                "       pg_relation_size('pgfence.leases'), pg_indexes_size('pgfence.leases'),"
                "       pg_total_relation_size('pgfence.leases')"
                "  from pg_stat_user_tables where relid = 'pgfence.leases'::regclass"
            ).fetchone()
        assert row is not None
        keys = ["upd", "hot", "dead", "autovacuums", "heap", "indexes", "total"]
        return {k: float(str(v)) for k, v in zip(keys, row, strict=True)}

    # Each client calls bench.renew_batch(n): n renewals, each its own transaction.
    n = first // CLIENTS
    started = time.monotonic()
    pgbench(
        server,
        db,
        BENCH / "renew_batch.sql",
        transactions=1,
        protocol="simple",
        defines={"n": n},
    )
    a = snapshot()
    pgbench(
        server,
        db,
        BENCH / "renew_batch.sql",
        transactions=(total - first) // first,
        protocol="simple",
        defines={"n": n},
    )
    b = snapshot()
    seconds = time.monotonic() - started
    out = {f"first_{k}": v for k, v in a.items()} | {f"all_{k}": v for k, v in b.items()}
    out |= {"first": first, "total": total, "tps": total / seconds, "seconds": seconds}
    return out


def takeover(opts: Options, server: Server) -> dict[str, object]:
    trials = 3 if opts.quick else 30
    ttl, poll, renew_every = 1.0, 0.2, 0.25
    rng = random.Random(7)
    latencies: list[float] = []
    parts: list[tuple[float, float, float]] = []  # kill → expiry → acquired → claimed
    misses = 0
    with server.connect("bench") as conn:
        for i in range(trials):
            conn.execute(
                "select pgfence.enqueue('takeover', %s::jsonb)", (f'{{"trial": {i}}}',)
            )
            owner = subprocess.Popen(
                [sys.executable, "-m", "bench.driver", "--owner", server.cluster.dsn("bench"),
                 "takeover", str(ttl), str(renew_every)],
                env=server.env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            CHILDREN.add(owner)
            assert owner.stdout is not None
            ready = owner.stdout.readline().split()
            if not ready or ready[0] != "ready":
                raise RuntimeError("the owner process did not acquire its lease")
            # The successor's polls start at a random phase of the poll interval.
            time.sleep(rng.uniform(0, poll))
            successor = Successor(server.cluster.dsn("bench"), poll, ttl)
            successor.start()
            # Killed at a random moment of its renewal cycle, at least one renewal in.
            time.sleep(renew_every + rng.uniform(0, 2 * renew_every))
            t_kill, wall_kill = time.monotonic(), time.time()
            owner.kill()
            owner.wait()
            CHILDREN.discard(owner)
            # A generous wait for a stuck successor: not an assertion, a way out.
            successor.join(ttl + poll + 30)
            if successor.t_claim is None or successor.t_acquired is None:
                successor.stop = True
                successor.join()
                misses += 1
                continue
            latencies.append(successor.t_claim - t_kill)
            row = conn.execute(
                "select extract(epoch from expires_at)::float8 from pgfence.leases"
                " where lease_id = %s",
                (ready[1],),
            ).fetchone()
            assert row is not None
            expiry = float(str(row[0])) - wall_kill
            acquired = successor.t_acquired - t_kill
            parts.append((expiry, acquired - expiry, successor.t_claim - successor.t_acquired))
    bound = ttl + poll + 0.1
    s = sorted(latencies)
    return {
        "trials": trials,
        "ttl": ttl,
        "poll": poll,
        "renew_every": renew_every,
        "bound": bound,
        "latencies": s,
        "misses": misses,
        "parts": parts,
        "within": sum(1 for v in s if v <= bound),
    }


def history(opts: Options, server: Server) -> dict[str, object]:
    queued, history, per_client, rounds = (
        (10_000, 100_000, 50, 1) if opts.quick else (100_000, 1_000_000, 900, 5)
    )
    claimers = 8
    dbs = {"empty": ("history_empty", 0), "full": ("history_full", history)}
    for db, n in dbs.values():
        server.createdb(db)
        server.psql(db, BENCH / "setup_history.sql", history=n)
    results: dict[str, list[float]] = {"empty": [], "full": []}
    cpu: dict[str, list[float]] = {"empty": [], "full": []}
    for rnd in range(rounds):
        order = ["empty", "full"] if rnd % 2 == 0 else ["full", "empty"]
        for key in order:
            db = dbs[key][0]
            server.psql(db, BENCH / "fill_history.sql", tasks=queued)
            res = pgbench(
                server, db, BENCH / "claim.sql", clients=claimers, transactions=per_client
            )
            ((left,),) = server.sql(
                db, "select count(*) from pgfence.tasks where state = 'queued'"
            )
            if int(str(left)) == 0:
                raise RuntimeError("claim history: the queue ran dry")
            results[key].append(res.tps)
            cpu[key].append(res.cpu_us)
            log(f"  claim with {key} history: {res.tps:.1f} tx/s {res.cpu_us:.1f} µs CPU/tx")
    sizes = {
        key: server.sql(db, "select pg_total_relation_size('pgfence.tasks')")[0][0]
        for key, (db, _n) in dbs.items()
    }
    return {
        "queued": queued,
        "history": history,
        "claimers": claimers,
        "claims_per_client": per_client,
        "results": results,
        "cpu": cpu,
        "sizes": sizes,
    }


DEAD_OPS = {  # operation: (pgbench script, clients)
    "request_start": ("request_start.sql", 1),
    "acquire": ("acquire_release_one.sql", 1),
    "claim": ("claim.sql", 8),
}


def dead_history(opts: Options, server: Server) -> dict[str, object]:
    """request_start, acquire (with its release) and claim against 1M rows of dead history of
    each kind (released leases, expired unacknowledged invocations, completed tasks) and
    against none; rounds alternate the two databases."""
    history, queued, seconds, rounds = (
        (20_000, 5_000, 1.0, 1) if opts.quick else (1_000_000, 200_000, 8.0, 3)
    )
    dbs = {"empty": ("dead_empty", 0), "full": ("dead_full", history)}
    for db, n in dbs.values():
        server.createdb(db)
        server.psql(db, BENCH / "setup_dead_history.sql", history=n)
    tps: dict[str, dict[str, list[float]]] = {op: {"empty": [], "full": []} for op in DEAD_OPS}
    for rnd in range(rounds):
        for op, (script, clients) in DEAD_OPS.items():
            order = ["empty", "full"] if rnd % 2 == 0 else ["full", "empty"]
            for key in order:
                db = dbs[key][0]
                if op == "claim":
                    server.psql(db, BENCH / "fill_history.sql", tasks=queued)
                res = pgbench(server, db, BENCH / script, clients=clients,
                              jobs=min(clients, 2), seconds=seconds)
                tps[op][key].append(res.tps)
                log(f"  {op} with {key} dead history: {res.tps:.1f} tx/s")
    return {"history": history, "seconds": seconds, "tps": tps}


def dead_history_report(h: dict[str, object]) -> list[str]:
    tps: dict[str, dict[str, list[float]]] = h["tps"]  # type: ignore[assignment]
    lines = [
        f"Each operation against {int(str(h['history'])):,} rows of dead history of each kind "
        "(released leases and expired, never acknowledged invocations of its resource, "
        "completed tasks in its queue) and against none; "
        f"{h['seconds']:g} s runs, rounds alternating the two databases:",
        "",
        "| operation | tx/s, no history (median) | tx/s, dead history (median) | ratio | "
        "target ≥ 0.90 |",
        "|---|---:|---:|---:|---|",
    ]
    for op, (script, clients) in DEAD_OPS.items():
        e, f = statistics.median(tps[op]["empty"]), statistics.median(tps[op]["full"])
        lines.append(f"| `{op}` (bench/{script}, {clients} client{'s' if clients > 1 else ''}) "
                     f"| {fmt(e)} | {fmt(f)} | {f / e:.2f} | "
                     f"{'met' if f / e >= 0.90 else '**not met**'} |")
    return lines


# The monitoring queries a dashboard polls, at the scale of a large installation, with the
# target each must stay under (milliseconds, wall time of the query and its rows).
SCALE_QUERIES: dict[str, tuple[str, float]] = {
    "counters, all rows": ("select * from pgfence.counters", 500),
    "counters, one resource": ("select * from pgfence.counters where resource = '{one}'", 10),
    "resource_status, one resource":
        ("select * from pgfence.resource_status where resource = '{one}'", 10),
    "health()": ("select * from pgfence.health()", 50),
    "queue_status": ("select * from pgfence.queue_status", 50),
    "resource_status, all rows (pgfence status)": ("select * from pgfence.resource_status", 500),
    "lease_status, one resource (no target)":
        ("select * from pgfence.lease_status where resource = '{one}'", math.inf),
}


SCALE_CANCEL_S = 120


def server_ms(conn: Connection, query: str) -> tuple[float, float]:
    """The server's time to execute ``query`` and produce all its rows (not to send them: the
    client's decoding of 100,000 rows would be most of a wall-clock time), from EXPLAIN
    ANALYZE without per-node timing, so that the instrumentation costs next to nothing; and
    the CPU time its backend spent meanwhile (/proc/PID/schedstat, in ns), which a loaded
    machine inflates far less than the elapsed time (a parallel worker's is not in it)."""
    pid = conn.info.backend_pid

    def cpu_ns() -> int:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])

    before = cpu_ns()
    plan = "\n".join(str(r[0]) for r in conn.execute(
        f"explain (analyze, timing off, summary on) {query}"))
    cpu = (cpu_ns() - before) / 1e6
    found = re.search(r"Execution Time: ([\d.]+) ms", plan)
    if found is None:
        raise RuntimeError(f"no execution time in the plan of {query}:\n{plan}")
    return float(found.group(1)), cpu


def scale(opts: Options, server: Server) -> dict[str, object]:
    """The monitoring queries against a fleet of resources, each with a live lease, and a
    history of finished tasks (bench/setup_scale.sql): each query's server time over a few
    runs on a warm cache (server_ms), and its EXPLAIN ANALYZE."""
    resources, finished = (2_000, 20_000) if opts.quick else (100_000, 1_000_000)
    runs = opts.rounds
    db = "scale"
    server.createdb(db)
    started = time.monotonic()
    server.psql(db, BENCH / "setup_scale.sql", resources=resources, finished=finished)
    log(f"  filled in {time.monotonic() - started:.0f} s")
    times: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    plans: dict[str, str] = {}
    with server.connect(db) as conn:
        # A query that takes longer is cancelled and reported as such (its plan unexecuted).
        conn.execute(f"set statement_timeout = '{SCALE_CANCEL_S}s'")
        for name, (template, _target) in SCALE_QUERIES.items():
            # A resource in the middle, one of those with takeovers (every tenth).
            query = template.format(one=f"r{resources // 2:06d}")
            times[name], cpus[name] = [], []
            try:
                server_ms(conn, query)  # warm
                for _ in range(runs):
                    elapsed, cpu = server_ms(conn, query)
                    times[name].append(elapsed)
                    cpus[name].append(cpu)
                explain = "explain (analyze, buffers)"
            except psycopg.errors.QueryCanceled:
                times[name], cpus[name] = [math.inf], [math.inf]
                explain = "explain"
            plans[name] = "\n".join(str(r[0]) for r in conn.execute(f"{explain} {query}"))
            log(f"  {name}: median {statistics.median(times[name]):,.1f} ms")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"resources": resources, "finished": finished, "runs": runs, "times": times,
            "cpus": cpus, "plans": plans, "load": " ".join(load)}


def scale_report(s: dict[str, object]) -> list[str]:
    times: dict[str, list[float]] = s["times"]  # type: ignore[assignment]
    cpus: dict[str, list[float]] = s["cpus"]  # type: ignore[assignment]
    plans: dict[str, str] = s["plans"]  # type: ignore[assignment]
    lines = [
        f"{int(str(s['resources'])):,} resources, each with a live lease, and "
        f"{int(str(s['finished'])):,} finished tasks (bench/setup_scale.sql); each query "
        f"{s['runs']} times on a warm cache, the server's execution time producing all its rows "
        f"(EXPLAIN ANALYZE, timing off), a query cancelled after {SCALE_CANCEL_S} s (load "
        f"average at the end: {s['load']}):",
        "",
        "| query | median ms | min-max ms | backend CPU ms (median) | target | met? |",
        "|---|---:|---|---:|---:|---|",
    ]
    for name, (_query, target) in SCALE_QUERIES.items():
        t = times[name]
        med = statistics.median(t)
        goal = "" if math.isinf(target) else f"< {target:g} ms"
        met = "" if math.isinf(target) else ("yes" if med < target else "**no**")
        spread = f"{min(t):,.1f}-{max(t):,.1f}"
        if math.isinf(med):
            spread = f"cancelled after {SCALE_CANCEL_S} s"
        cpu = statistics.median(cpus[name])
        lines.append(f"| {name} | {med:,.1f} | {spread} | {cpu:,.1f} | {goal} | {met} |")
    lines += ["", "EXPLAIN (ANALYZE, BUFFERS) of each:", ""]
    for name, plan in plans.items():
        lines += [f"<details><summary>{name}</summary>", "", "```", plan, "```", "",
                  "</details>", ""]
    return lines


class Successor(threading.Thread):
    """A standby that polls acquire at a fixed interval; on success it claims at once and
    records when its first claim returned a task."""

    def __init__(self, dsn: str, poll: float, ttl: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.poll, self.ttl = dsn, poll, ttl
        self.t_acquired: float | None = None
        self.t_claim: float | None = None
        self.stop = False

    def run(self) -> None:
        with connect(self.dsn, "successor") as conn:
            tick = time.monotonic()
            while not self.stop:
                row = conn.execute(
                    "select lease_id from pgfence.acquire('takeover', 'successor', %s)",
                    (f"{self.ttl} seconds",),
                ).fetchone()
                lease = row[0] if row else None
                if lease is not None:
                    self.t_acquired = time.monotonic()
                    got = conn.execute(
                        "select attempt_id from pgfence.claim(%s, 'takeover', 1, '30 seconds')",
                        (lease,),
                    ).fetchall()
                    if got:
                        self.t_claim = time.monotonic()
                        conn.execute("select pgfence.complete(%s)", (got[0][0],))
                    conn.execute("select pgfence.release(%s)", (lease,))
                    if got:
                        return
                tick += self.poll
                time.sleep(max(0.0, tick - time.monotonic()))


def owner_main(dsn: str, resource: str, ttl: float, renew_every: float) -> None:
    """The owner of a takeover trial, killed by the driver: acquires, then renews forever."""
    with connect(dsn, "owner") as conn:
        row = conn.execute(
            "select lease_id from pgfence.acquire(%s, 'owner', %s)", (resource, f"{ttl} seconds")
        ).fetchone()
        if row is None or row[0] is None:
            print("busy", flush=True)
            return
        print(f"ready {row[0]}", flush=True)
        while True:
            time.sleep(renew_every)
            conn.execute("select pgfence.renew(%s, %s)", (row[0], f"{ttl} seconds"))


# ---------------------------------------------------------------------------------------------
# The report


def renewals_report(r: dict[str, float]) -> list[str]:
    hot = r["all_hot"] / r["all_upd"] if r["all_upd"] else math.nan
    growth = r["all_total"] / r["first_total"]
    kib = 1024
    return [
        f"{int(r['total']):,} renewals of random leases of 1,000, each its own transaction, from 4 "
        f"concurrent sessions (bench/renew_batch.sql; {r['tps']:,.0f} renewals/s, "
        f"{r['seconds']:.0f} s), "
        "autovacuum at its defaults:",
        "",
        "| | after the first "
        + f"{int(r['first']):,}"
        + " | after "
        + f"{int(r['total']):,}"
        + " | target | met? |",
        "|---|---:|---:|---:|---|",
        f"| HOT share of lease updates (n_tup_hot_upd / n_tup_upd) | "
        f"{r['first_hot'] / r['first_upd']:.1%} | {hot:.1%} | ≥ 95% | "
        f"{'yes' if hot >= 0.95 else '**no**'} |",
        f"| pgfence.leases heap | {r['first_heap'] / kib:,.0f} KiB "
        f"| {r['all_heap'] / kib:,.0f} KiB | | |",
        f"| its indexes | {r['first_indexes'] / kib:,.0f} KiB "
        f"| {r['all_indexes'] / kib:,.0f} KiB | | |",
        f"| table + indexes (pg_total_relation_size) | {r['first_total'] / kib:,.0f} KiB | "
        f"{r['all_total'] / kib:,.0f} KiB ({growth:.2f}x) | ≤ 2x | "
        f"{'yes' if growth <= 2 else '**no**'} |",
        f"| autovacuums of pgfence.leases so far | {int(r['first_autovacuums'])} | "
        f"{int(r['all_autovacuums'])} | | |",
    ]


def takeover_report(t: dict[str, object]) -> list[str]:
    lat: list[float] = t["latencies"]  # type: ignore[assignment]
    parts: list[tuple[float, float, float]] = t["parts"]  # type: ignore[assignment]
    bound: float = t["bound"]  # type: ignore[assignment]
    dist = ", ".join(
        f"{name} {percentile(lat, p) * 1000:.0f} ms"
        for name, p in (("min", 0), ("p50", 50), ("p90", 90), ("max", 100))
    )
    ok = t["within"] == t["trials"]
    never = f" ({t['misses']} never claimed)" if t["misses"] else ""
    return [
        f"{t['trials']} trials: an owner process acquires (TTL {t['ttl']} s), renews every "
        f"{t['renew_every']} s and is killed (SIGKILL) at a random point of its renewal cycle; "
        f"a successor polls acquire every {t['poll']} s and claims as soon as it holds the lease. "
        f"Latency = kill → the successor's first claim returned a task.",
        "",
        "| takeover latency | distribution | bound (TTL + poll + 100 ms) | within | met? |",
        "|---|---|---:|---:|---|",
        f"| owner killed → successor's first claim | {dist} | {bound * 1000:.0f} ms "
        f"| {t['within']}/{t['trials']}{never} "
        f"| {'yes' if ok else '**no**'} |",
        "",
        "Where the time went (ms; min / median / max over the trials):",
        "",
        "| kill → the lease's expires_at (≤ TTL) | expires_at → successor's acquire returned "
        "(≤ poll) | acquire → first claim returned |",
        "|---:|---:|---:|",
        "| "
        + " | ".join(
            " / ".join(f"{v * 1000:.0f}" for v in (min(c), statistics.median(c), max(c)))
            for c in zip(*parts, strict=True)
        )
        + " |"
        if parts
        else "",
        "",
        "All latencies (ms): " + ", ".join(f"{v * 1000:.0f}" for v in lat),
    ]


def history_report(h: dict[str, object]) -> list[str]:
    res: dict[str, list[float]] = h["results"]  # type: ignore[assignment]
    cpu: dict[str, list[float]] = h["cpu"]  # type: ignore[assignment]
    sizes: dict[str, object] = h["sizes"]  # type: ignore[assignment]
    e, f = statistics.median(res["empty"]), statistics.median(res["full"])
    ce, cf = statistics.median(cpu["empty"]), statistics.median(cpu["full"])
    ratio = f / e
    return [
        f"Claim throughput, {h['claimers']} concurrent claimers (bench/claim.sql, "
        "10 tasks a claim, "
        f"{h['claims_per_client']} claims each, pgbench -c {h['claimers']} -j 2), each round from "
        f"{int(str(h['queued'])):,} freshly queued and vacuumed tasks; rounds alternate:",
        "",
        "| history in pgfence.tasks | claims/s (median) | every round | server CPU µs/claim "
        "| table + indexes at the end |",
        "|---|---:|---|---:|---:|",
        f"| none | {fmt(e)} | {', '.join(fmt(x) for x in res['empty'])} | {ce:,.0f} "
        f"| {int(str(sizes['empty'])) / 2**20:,.0f} MiB |",
        f"| {int(str(h['history'])):,} completed tasks | {fmt(f)} | "
        f"{', '.join(fmt(x) for x in res['full'])} | {cf:,.0f} "
        f"| {int(str(sizes['full'])) / 2**20:,.0f} MiB |",
        "",
        f"With history / without: **{ratio:.2f}** (target ≥ 0.80, no more than 20% slower): "
        f"{'met' if ratio >= 0.80 else '**not met**'}. Server CPU per claim, without / with "
        f"history: {ce / cf:.2f}.",
    ]


# ---------------------------------------------------------------------------------------------

