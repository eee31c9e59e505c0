"""The pairs: each pgfence operation against a baseline doing the same work without fencing,
run alternately in rounds (the order of a pair's members reversed every other round), and
their report. A new pair is a Group in Pairs.groups() with a pgbench script in bench/."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from .report import fmt
from .run import BENCH, CLIENTS, BenchResult, Options, Server, log, percentile, pgbench


@dataclass
class Member:
    label: str
    script: str
    prepare: Callable[[Member], None] | None = None  # fresh tables before each run
    check: Callable[[Member], str | None] | None = None  # after a run: None, or why it is void
    latencies: bool = False
    size: int = 0  # rows prepared, grown when too few
    per_tx: int = 1  # units (tasks, messages, jobs) per transaction: rates are tx/s x per_tx
    best_tps: float = 0.0  # the best rate seen, also of runs that ran out of work
    results: list[BenchResult] = field(default_factory=list)

    @property
    def median_tps(self) -> float:
        return statistics.median(r.tps for r in self.results)

    @property
    def median_cpu(self) -> float:
        return statistics.median(r.cpu_us for r in self.results)

    @property
    def median_rate(self) -> float:
        """Units per second: tasks, messages or jobs, not transactions."""
        return self.median_tps * self.per_tx

    @property
    def median_cpu_per_unit(self) -> float:
        return self.median_cpu / self.per_tx


@dataclass
class Comparison:
    operation: str
    pgfence: int  # index into the group's members
    baseline: int
    target: float


@dataclass
class Group:
    key: str
    members: list[Member]
    comparisons: list[Comparison]


class Pairs:
    def __init__(self, opts: Options, server: Server) -> None:
        self.opts = opts
        self.server = server
        self.profiles: dict[str, list[tuple[object, ...]]] = {}

    # -- fixtures ------------------------------------------------------------------------------

    def fill(self, file: str, member: Member, per_tx: int, guess_tps: float = 3000) -> None:
        """Fresh tables for a member: enough rows for its duration at the best rate seen so
        far (at least a generous first guess, guess_tps transactions per second), so that a run
        never runs out of work; for --quick's few transactions, twice what they take."""
        if self.opts.transactions:
            wanted = 2 * CLIENTS * self.opts.transactions * per_tx
        else:
            best = max(member.best_tps, guess_tps)
            wanted = math.ceil(1.5 * best * per_tx * self.opts.seconds)
        member.size = max(member.size, wanted)
        self.server.psql("bench", BENCH / file, tasks=member.size)

    def ready_left(self, table: str) -> Callable[[Member], str | None]:
        def check(member: Member) -> str | None:
            ((left,),) = self.server.sql(
                "bench", f"select count(*) from {table} where state = 'queued'"
            )
            return None if int(str(left)) > 0 else "the queue ran dry"

        return check

    def visible_left(self, queue: str) -> Callable[[Member], str | None]:
        def check(member: Member) -> str | None:
            ((left,),) = self.server.sql(
                "bench", f"select count(*) from pgmq.q_{queue} where vt <= clock_timestamp()"
            )
            return None if int(str(left)) > 0 else "the queue ran dry"

        return check

    def handles_left(self, seq: str) -> Callable[[Member], str | None]:
        def check(member: Member) -> str | None:
            ((last,),) = self.server.sql("bench", f"select last_value from {seq}")
            return None if int(str(last)) < member.size else "the prepared tasks ran out"

        return check

    def batches_left(self, seq: str, per_tx: int) -> Callable[[Member], str | None]:
        """As handles_left, for a member that takes per_tx handles per transaction."""

        def check(member: Member) -> str | None:
            ((last,),) = self.server.sql("bench", f"select last_value from {seq}")
            return None if int(str(last)) * per_tx < member.size else "the prepared tasks ran out"

        return check

    def groups(self) -> list[Group]:
        def rows(_m: Member) -> None:
            self.server.psql("bench", BENCH / "reset_rows.sql")

        claim = [
            Member(
                "claim 10 (pgfence.claim, shared lease)",
                "claim.sql",
                lambda m: self.fill("fill_tasks.sql", m, 10),
                self.ready_left("pgfence.tasks"),
            ),
            Member(
                "same claim without the ownership check",
                "claim_unfenced.sql",
                lambda m: self.fill("fill_tasks.sql", m, 10),
                self.ready_left("pgfence.tasks"),
            ),
            Member(
                "hand-written queue: UPDATE ... FROM (SELECT ... SKIP LOCKED LIMIT 10)",
                "claim_bare.sql",
                lambda m: self.fill("fill_queue.sql", m, 10),
                self.ready_left("bench.queue"),
            ),
        ]
        claim.append(
            Member(
                "same claim with the lease check inline (FOR KEY SHARE)",
                "claim_floor.sql",
                lambda m: self.fill("fill_tasks.sql", m, 10),
                self.ready_left("pgfence.tasks"),
            )
        )
        if self.opts.own_lease:
            claim.append(
                Member(
                    "claim 10 (pgfence.claim, a lease per client)",
                    "claim_own_lease.sql",
                    lambda m: self.fill("fill_tasks.sql", m, 10),
                    self.ready_left("pgfence.tasks"),
                )
            )
        groups = [
            Group(
                "renew",
                [
                    Member("renew (pgfence.renew)", "renew.sql"),
                    Member("raw UPDATE ... SET expires_at by key", "renew_raw.sql"),
                    Member("hand-written renew: the same judgement, inline", "renew_floor.sql"),
                ],
                [
                    Comparison("renew 1 of 1,000 leases", 0, 1, 0.95),
                    Comparison("renew: vs the hand-written floor", 0, 2, 0.85),
                ],
            ),
            Group(
                "claim",
                claim,
                [
                    Comparison("claim 10 tasks: cost of fencing alone", 0, 1, 0.95),
                    Comparison("claim 10 tasks: vs a hand-written queue", 0, 2, 0.80),
                    Comparison("claim 10 tasks: vs the hand-written floor", 0, 3, 0.85),
                ]
                + (
                    [
                        Comparison(
                            "claim 10 tasks, a lease per client: vs a hand-written queue",
                            4,
                            2,
                            0.80,
                        )
                    ]
                    if self.opts.own_lease
                    else []
                ),
            ),
            Group(
                "complete",
                [
                    Member(
                        "complete (pgfence.complete by attempt_id)",
                        "complete.sql",
                        lambda m: self.fill("fill_claimed.sql", m, 1),
                        self.handles_left("bench.handles_seq"),
                    ),
                    Member(
                        "raw UPDATE ... WHERE task_id = ...",
                        "complete_raw.sql",
                        lambda m: self.fill("fill_claimed_raw.sql", m, 1),
                        self.handles_left("bench.handles_raw_seq"),
                    ),
                    Member(
                        "hand-written attempt-checked UPDATE",
                        "complete_floor.sql",
                        lambda m: self.fill("fill_claimed_raw.sql", m, 1),
                        self.handles_left("bench.handles_raw_seq"),
                    ),
                ],
                [
                    Comparison("complete by attempt id", 0, 1, 0.90),
                    Comparison("complete: vs the hand-written floor", 0, 2, 0.85),
                ],
            ),
            Group(
                "fence1",
                [
                    Member("fence + INSERT 1 row (protected table)", "fence_insert_1.sql", rows),
                    Member("INSERT 1 row (plain table)", "insert_1.sql", rows),
                    Member(
                        "INSERT 1 row ... SELECT pgfence.fence(...) (protected table)",
                        "fence_insert_1_one_statement.sql",
                        rows,
                    ),
                    Member(
                        "INSERT 1 row ... SELECT pgfence.fence(...) (unprotected table)",
                        "fence_insert_1_unprotected.sql",
                        rows,
                    ),
                    Member(
                        "hand-written fence: INSERT ... SELECT generation FROM leases"
                        " ... FOR KEY SHARE",
                        "fence_insert_1_floor.sql",
                        rows,
                    ),
                    Member(
                        "hand-written fence, two statements: SELECT generation ... FOR KEY SHARE;"
                        " INSERT",
                        "fence_insert_1_floor_tx.sql",
                        rows,
                    ),
                    Member(
                        "fence + INSERT 1 row (unprotected table)",
                        "fence_insert_1_unprotected_tx.sql",
                        rows,
                    ),
                ],
                [
                    Comparison("fence + insert 1 row", 0, 1, 0.75),
                    Comparison("fence + insert 1 row, in one statement", 2, 1, 0.75),
                    Comparison("fenced 1-row write, 1 statement, protected: vs the floor", 2, 4,
                               0.80),
                    Comparison("fenced 1-row write, 1 statement, unprotected: vs the floor", 3, 4,
                               0.80),
                    Comparison("fenced 1-row write, 2 statements, protected: vs the floor", 0, 5,
                               0.80),
                    Comparison("fenced 1-row write, 2 statements, unprotected: vs the floor", 6, 5,
                               0.80),
                ],
            ),
            Group(
                "fence100",
                [
                    Member(
                        "fence + INSERT 100 rows (protected table)", "fence_insert_100.sql", rows
                    ),
                    Member("INSERT 100 rows (plain table)", "insert_100.sql", rows),
                ],
                [Comparison("fence + insert 100 rows", 0, 1, 0.95)],
            ),
            Group(
                "pgmq",
                [
                    Member(
                        "pgmq_read 10 (pgfence_pgmq.read, shared lease)",
                        "pgmq_read.sql",
                        lambda m: self.fill("fill_pgmq.sql", m, 10),
                        self.visible_left("bench"),
                    ),
                    Member(
                        "pgmq.read 10",
                        "pgmq_read_raw.sql",
                        lambda m: self.fill("fill_pgmq.sql", m, 10),
                        self.visible_left("bench_raw"),
                    ),
                    Member(
                        "pgmq_archive (pgfence_pgmq.archive by attempt_id)",
                        "pgmq_archive.sql",
                        lambda m: self.fill("fill_pgmq_read.sql", m, 1),
                        self.handles_left("bench.handles_seq"),
                    ),
                    Member(
                        "pgmq.archive by msg_id",
                        "pgmq_archive_raw.sql",
                        lambda m: self.fill("fill_pgmq_read.sql", m, 1),
                        self.handles_left("bench.handles_raw_seq"),
                    ),
                ],
                [
                    Comparison("pgmq: read 10 messages", 0, 1, 0.90),
                    Comparison("pgmq: archive 1 message", 2, 3, 0.90),
                ],
            ),
            Group(
                "pgflow",
                [
                    Member(
                        "pgflow start + complete (pgfence_pgflow, shared lease)",
                        "pgflow_cycle.sql",
                        lambda m: self.fill("fill_pgflow_fenced.sql", m, 1, guess_tps=1000),
                        self.visible_left("bench_flow"),
                    ),
                    Member(
                        "pgflow's own read + start_tasks + complete_task",
                        "pgflow_cycle_raw.sql",
                        lambda m: self.fill("fill_pgflow_raw.sql", m, 1, guess_tps=1000),
                        self.visible_left("bench_flow_raw"),
                    ),
                    Member(
                        "the same with pgflow's own visibility rule applied (set_vt_batch)",
                        "pgflow_cycle_raw_vt.sql",
                        lambda m: self.fill("fill_pgflow_raw.sql", m, 1, guess_tps=1000),
                        self.visible_left("bench_flow_raw"),
                    ),
                ],
                [
                    Comparison("pgflow: start + complete 1 task", 0, 1, 0.85),
                    Comparison("pgflow: start + complete 1 task, the same work", 0, 2, 0.85),
                ],
            ),
            Group(
                "cycle",
                [
                    Member(
                        "takeover: acquire superseding an expired lease",
                        "takeover.sql",
                        latencies=True,
                    ),
                    Member("acquire + release", "acquire_release.sql", latencies=True),
                ],
                [],
            ),
            Group(
                "batch",
                [
                    Member(
                        "complete 1 per call (pgfence.complete)",
                        "complete.sql",
                        lambda m: self.fill("fill_claimed.sql", m, 1),
                        self.handles_left("bench.handles_seq"),
                    ),
                    Member(
                        "complete 10 per call (pgfence.complete_many)",
                        "complete_many_10.sql",
                        lambda m: self.fill("fill_claimed.sql", m, 10),
                        self.batches_left("bench.handles_seq", 10),
                        per_tx=10,
                    ),
                    Member(
                        "complete 100 per call (pgfence.complete_many)",
                        "complete_many_100.sql",
                        lambda m: self.fill("fill_claimed.sql", m, 100, guess_tps=800),
                        self.batches_left("bench.handles_seq", 100),
                        per_tx=100,
                    ),
                    Member(
                        "pgmq_archive 1 per call (pgfence_pgmq.archive)",
                        "pgmq_archive.sql",
                        lambda m: self.fill("fill_pgmq_read.sql", m, 1),
                        self.handles_left("bench.handles_seq"),
                    ),
                    Member(
                        "pgmq_archive 10 per call (pgfence_pgmq.archive_many)",
                        "pgmq_archive_many_10.sql",
                        lambda m: self.fill("fill_pgmq_read.sql", m, 10),
                        self.batches_left("bench.handles_seq", 10),
                        per_tx=10,
                    ),
                ],
                [
                    Comparison("tasks completed: 10 per call vs one by one", 1, 0, 3.0),
                    Comparison("tasks completed: 100 per call vs one by one", 2, 0, 5.0),
                    Comparison("pgmq messages archived: 10 per call vs one by one", 4, 3, 3.0),
                ],
            ),
            Group(
                "queue",
                [
                    Member(
                        "enqueue 10 + claim 10 + complete_many 10, one transaction (pgfence)",
                        "cycle_fenced.sql",
                        lambda m: self.server.psql("bench", BENCH / "fill_cycle.sql"),
                        per_tx=10,
                    ),
                    Member(
                        "hand-written queue: insert 10 + UPDATE ... SKIP LOCKED LIMIT 10"
                        " + UPDATE completing them, one transaction",
                        "cycle_bare.sql",
                        lambda m: self.server.psql("bench", BENCH / "fill_cycle.sql"),
                        per_tx=10,
                    ),
                ],
                [Comparison("jobs through the whole cycle, 10 per transaction", 0, 1, 0.50)],
            ),
        ]
        return [g for g in groups if self.opts.wanted(g.key)]

    # -- running -------------------------------------------------------------------------------

    def run_member(self, member: Member) -> None:
        for _attempt in range(4):
            if member.prepare:
                member.prepare(member)
            if self.opts.profile:
                self.server.sql("bench", "select pg_stat_statements_reset()")
            result = pgbench(
                self.server,
                "bench",
                BENCH / member.script,
                seconds=None if self.opts.transactions else self.opts.seconds,
                transactions=self.opts.transactions,
                latencies=member.latencies,
            )
            member.best_tps = max(member.best_tps, result.tps)
            void = member.check(member) if member.check else None
            if void is None:
                member.results.append(result)
                log(f"  {member.script:24s} {result.tps:10.1f} tx/s {result.cpu_us:8.1f} µs CPU/tx")
                if self.opts.profile:
                    self.profiles[member.script] = self.server.sql(
                        "bench",
                        "select calls, round((total_exec_time / calls)::numeric * 1000, 1),"
                        "       left(regexp_replace(query, '\\s+', ' ', 'g'), 140)"
                        "  from pg_stat_statements where calls >= 10"
                        " order by total_exec_time desc limit 8",
                    )
                return
            log(f"  {member.script}: {void} at {member.size} rows; again with more")
            member.size *= 2  # and fill() sizes from the rate of the run that ran out
        raise RuntimeError(f"{member.script}: {void} even with {member.size} rows")

    def run(self) -> list[Group]:
        groups = self.groups()
        for rnd in range(self.opts.rounds):
            log(f"round {rnd + 1}/{self.opts.rounds}")
            for group in groups:
                order = group.members if rnd % 2 == 0 else list(reversed(group.members))
                for member in order:
                    self.run_member(member)
        return groups



def pairs_report(groups: list[Group]) -> list[str]:
    out = [
        "| operation | baseline | baseline tx/s | pgfence tx/s | ratio | target | met? "
        "| per-round ratios | server CPU µs/tx, baseline → pgfence (ratio) |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for g in groups:
        for c in g.comparisons:
            p, b = g.members[c.pgfence], g.members[c.baseline]
            if p.per_tx != 1 or b.per_tx != 1:
                continue  # in the table of units below
            ratio = p.median_tps / b.median_tps
            per_round = [x.tps / y.tps for x, y in zip(p.results, b.results, strict=True)]
            out.append(
                f"| {c.operation} | {b.label} | {fmt(b.median_tps)} | {fmt(p.median_tps)} "
                f"| {ratio:.2f} | ≥ {c.target:.2f} | {'yes' if ratio >= c.target else '**no**'} "
                f"| {min(per_round):.2f}-{max(per_round):.2f} "
                f"| {b.median_cpu:,.0f} → {p.median_cpu:,.0f} ({b.median_cpu / p.median_cpu:.2f}) |"
            )
    if len(out) == 2:  # every comparison is in units: no table of transactions
        out = []
    units = [(g, c) for g in groups for c in g.comparisons
             if g.members[c.pgfence].per_tx != 1 or g.members[c.baseline].per_tx != 1]
    if units:
        out += [""] if out else []
        out += [
            "| operation | baseline | baseline /s | pgfence /s | ratio | target | met? "
            "| per-round ratios | server CPU µs per unit, baseline → pgfence (ratio) |",
            "|---|---|---:|---:|---:|---:|---|---|---|",
        ]
        for g, c in units:
            p, b = g.members[c.pgfence], g.members[c.baseline]
            ratio = p.median_rate / b.median_rate
            per_round = [x.tps * p.per_tx / (y.tps * b.per_tx)
                         for x, y in zip(p.results, b.results, strict=True)]
            out.append(
                f"| {c.operation} | {b.label} | {fmt(b.median_rate)} | {fmt(p.median_rate)} "
                f"| {ratio:.2f} | ≥ {c.target:.2f} | {'yes' if ratio >= c.target else '**no**'} "
                f"| {min(per_round):.2f}-{max(per_round):.2f} "
                f"| {b.median_cpu_per_unit:,.0f} → {p.median_cpu_per_unit:,.0f} "
                f"({b.median_cpu_per_unit / p.median_cpu_per_unit:.2f}) |"
            )
        out += [
            "",
            "Units (tasks, messages or jobs) per second: the median tx/s times the units each "
            "transaction does; CPU per unit: per transaction divided by units.",
        ]
    queue = [g for g in groups if g.key == "queue"]
    if queue:
        cores = os.cpu_count() or 1
        out += [
            "",
            f"| whole cycle | jobs/s | jobs/s per core ({cores} cores) | server CPU µs per job |",
            "|---|---:|---:|---:|",
        ]
        for m in queue[0].members:
            out.append(f"| {m.label} | {fmt(m.median_rate)} | {fmt(m.median_rate / cores)} "
                       f"| {m.median_cpu_per_unit:,.0f} |")
    cycle = [g for g in groups if g.key == "cycle"]
    if cycle:
        out += [
            "",
            "| cycle (no baseline) | tx/s (median) | latency p50 | p90 | p99 | max |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for m in cycle[0].members:
            lat = sorted(v for r in m.results for v in r.latencies_us)
            out.append(
                f"| {m.label} | {fmt(m.median_tps)} | "
                + " | ".join(f"{percentile(lat, p) / 1000:.2f} ms" for p in (50, 90, 99, 100))
                + " |"
            )
    out += [
        "",
        "Throughput: the median over rounds of each member's tx/s, 4 clients (pgbench -c 4 -j 2 "
        "-M prepared); ratio = pgfence / baseline of the medians, target on that ratio. "
        "Server CPU: "
        "CPU time of the benchmark's backends per transaction, median over rounds; its ratio is "
        "baseline / pgfence, so that it reads like the throughput ratio. "
        "Every run, in order (tx/s):",
        "",
    ]
    for g in groups:
        for m in g.members:
            out.append(
                f"- `bench/{m.script}`: {', '.join(fmt(r.tps) for r in m.results)}"
                + (f" (prepared rows per run: {m.size:,})" if m.size else "")
                + (f" (tx/s; {m.per_tx} units per transaction)" if m.per_tx != 1 else "")
            )
    return out

