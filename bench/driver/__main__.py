"""pgfence's performance benchmarks: each operation against raw SQL doing the same work
without fencing, measured with pgbench in the same run, and the properties over time.

    scripts/bench                 the full run (about 12 minutes); prints a Markdown report
    scripts/bench --quick         every pair once, a few transactions per client, small sizes
                                  (CI smoke: proves the driver and every script work; numbers
                                  mean nothing, nothing is asserted)
    scripts/bench --report FILE   also write the report to FILE
    scripts/bench --apply FILE    run FILE in every benchmark database after sql/pgfence.sql
    scripts/bench --release 0.2.1 pgfence and its layers as release 0.2.1 shipped them
                                  (sql/releases), the other member of a release's A/B pair
                                  (to measure a proposed change, e.g. `create or replace function`)
    scripts/bench --only renew,claim,...   a subset (see --help)
    scripts/bench --profile       load pg_stat_statements (track = all) and print each
                                  operation's top statements; its overhead skews the timings

It starts its own throwaway cluster (testkit.cluster, default settings), installs
sql/pgfence.sql into fresh databases, runs the pgbench scripts of bench/ and removes the
cluster on exit, also on Ctrl-C or SIGTERM. Pairs run alternately, a few rounds, the order of
a pair's members reversed every other round; throughput is reported as the median over
rounds, and the ratio pgfence/baseline is the ratio of the medians (the per-round ratios and
the server CPU per transaction are shown too). There are no assertions on time: the report
says whether each target was met. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path

from testkit.cluster import Cluster

from .pairs import Group, Pairs, pairs_report
from .properties import (
    dead_history,
    dead_history_report,
    history,
    history_report,
    owner_main,
    renewals,
    renewals_report,
    scale,
    scale_report,
    takeover,
    takeover_report,
)
from .report import environment
from .run import (
    BENCH,
    QUICK_TRANSACTIONS,
    Interrupted,
    Options,
    Server,
    log,
    on_signal,
    stop_children,
)
from .workers import FLOW_SETUP, FLOW_SYSTEMS, worker_main, workers, workers_report


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="every pair once, briefly, small sizes")
    p.add_argument("--rounds", type=int, help="rounds of each pair (default 7; --quick 1)")
    p.add_argument("--seconds", type=float, help="seconds per pgbench run (default 4; --quick runs "
                   f"{QUICK_TRANSACTIONS} transactions per client instead)")
    p.add_argument(
        "--only",
        type=lambda s: set(s.split(",")),
        help="comma-separated subset of: renew, claim, complete, fence1, fence100, pgmq, "
        "pgflow, cycle, batch, queue, renewals, takeover, history, dead, scale, workers, flows",
    )
    p.add_argument(
        "--own-lease",
        action="store_true",
        help="also claim with a lease per client (bench/claim_own_lease.sql)",
    )
    p.add_argument(
        "--apply",
        type=Path,
        action="append",
        default=[],
        help="SQL file run after sql/pgfence.sql in every benchmark database",
    )
    p.add_argument(
        "--release",
        help="install pgfence and the layers as release X shipped them (sql/releases) instead "
        "of the head: the before member of an A/B pair of releases",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="pg_stat_statements (track = all): top statements of each operation",
    )
    p.add_argument(
        "--fsync",
        choices=("on", "off"),
        default="on",
        help="the server's fsync (default on, PostgreSQL's default; off makes commits cheap, "
        "so that the CPU around them shows)",
    )
    p.add_argument("--jobs", type=int, default=2000,
                   help="jobs per run of the workers group (default 2000; --quick 100)")
    p.add_argument("--peers", action="store_true",
                   help="the workers group: procrastinate, pgqueuer, graphile-worker and pg-boss "
                   "too, from the environment bench/peers/setup installs")
    p.add_argument("--report", type=Path, help="also write the Markdown report to this file")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--owner"]:  # the owner process of a takeover trial
        owner_main(argv[1], argv[2], float(argv[3]), float(argv[4]))
        return 0
    if argv[:1] == ["--worker"]:  # a worker process of the workers group
        worker_main(argv[1], argv[2], int(argv[3]), int(argv[4]))
        return 0
    args = parse_args(argv)
    quick: bool = args.quick
    opts = Options(
        quick=quick,
        rounds=args.rounds or (1 if quick else 7),
        seconds=args.seconds or 4,
        # --quick proves that every script runs: a few transactions per client, not seconds.
        transactions=QUICK_TRANSACTIONS if quick and not args.seconds else None,
        profile=args.profile,
        own_lease=args.own_lease,
        only=frozenset(args.only) if args.only else None,
        jobs=args.jobs,
        peers=args.peers,
    )
    settings = (
        ["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all"]
        if args.profile
        else []
    ) + ([] if args.fsync == "on" else ["fsync=off"])
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    started = time.monotonic()
    cluster: Cluster | None = None
    try:
        log("starting a cluster (testkit.cluster)")
        cluster = Cluster.start(settings)
        server = Server(cluster, settings, [a.resolve() for a in args.apply], args.release)
        server.createdb("bench")
        if args.profile:
            server.sql("bench", "create extension pg_stat_statements")
        server.psql("bench", BENCH / "setup.sql")
        command = "scripts/bench" + ("" if not argv else " " + shlex.join(argv))
        report = [f"Command: `{command}`", "", "Environment:", "", *environment(server), ""]
        groups: list[Group] = []
        pairs = Pairs(opts, server)
        keys = ("renew", "claim", "complete", "fence1", "fence100", "pgmq", "pgflow", "cycle",
                "batch", "queue")
        if any(opts.wanted(k) for k in keys):
            per_run = (f"{opts.transactions} transactions per client" if opts.transactions
                       else f"{opts.seconds:g} s")
            log(f"pairs: {opts.rounds} rounds of {per_run} per run")
            groups = pairs.run()
            report += ["### Pairs", "", *pairs_report(groups), ""]
        if opts.wanted("renewals"):
            log("property: renewals")
            report += ["### Renewals over time", "", *renewals_report(renewals(opts, server)), ""]
        if opts.wanted("takeover"):
            log("property: takeover latency")
            report += ["### Takeover latency", "", *takeover_report(takeover(opts, server)), ""]
        if opts.wanted("history"):
            log("property: claim with history")
            report += [
                "### Claim with a completed history",
                "",
                *history_report(history(opts, server)),
                "",
            ]
        if opts.wanted("dead"):
            log("property: request_start, acquire and claim with dead history")
            report += ["### Dead history", "", *dead_history_report(dead_history(opts, server)),
                       ""]
        if opts.wanted("workers"):
            log("the whole cycle through workers")
            report += ["### Workers", "", *workers_report(workers(opts, server)), ""]
        if opts.wanted("flows"):
            log("the pgflow cycle through workers")
            report += ["### pgflow workers", "",
                       *workers_report(workers(opts, server, FLOW_SYSTEMS, FLOW_SETUP)), ""]
        if opts.wanted("scale"):
            log("property: monitoring at scale")
            report += ["### Monitoring at scale", "", *scale_report(scale(opts, server)), ""]
        if pairs.profiles:
            report += ["### Profile (pg_stat_statements, track = all; mean µs per call)", ""]
            for script, rows in pairs.profiles.items():
                report += [f"`{script}`:", "", "| calls | mean µs | statement |", "|---:|---:|---|"]
                report += [f"| {c} | {t} | `{q}` |" for c, t, q in rows[:8]]
                report.append("")
        report.append(f"Run time: {time.monotonic() - started:.0f} s.")
        text = "\n".join(report) + "\n"
        print(text)
        if args.report:
            args.report.write_text(text)
        return 0
    except (KeyboardInterrupt, Interrupted) as e:
        log(f"interrupted ({str(e) or 'SIGINT'}): stopping")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_children()
        if cluster is not None:
            cluster.remove()
        log(f"cluster removed; {time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
