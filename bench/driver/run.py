"""What every benchmark needs: the options, the cluster under test, pgbench runs, and the
driver's child processes, tracked so that an interrupt can stop them."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from pgfence.connection import Connection, connect
from testkit import install
from testkit.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
BUNDLE = install.BUNDLE
CLIENTS, JOBS = 4, 2
QUICK_TRANSACTIONS = 20  # --quick: per client and pgbench run


@dataclass(frozen=True)
class Options:
    quick: bool
    rounds: int
    seconds: float  # per pgbench run of a pair
    transactions: int | None  # per client and run of a pair instead (--quick): proves, not measures
    profile: bool  # pg_stat_statements: each operation's top statements
    own_lease: bool
    only: frozenset[str] | None
    jobs: int = 2000  # per run of the workers group
    peers: bool = False  # the workers group: the peers too (bench/peers)

    def wanted(self, key: str) -> bool:
        return not self.only or key in self.only


# ---------------------------------------------------------------------------------------------
# Processes: everything the driver starts is tracked, so an interrupt can stop it.

CHILDREN: set[subprocess.Popen[str]] = set()


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(args: Sequence[str | Path], env: dict[str, str] | None = None) -> str:
    proc = subprocess.Popen(
        [str(a) for a in args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    CHILDREN.add(proc)
    try:
        out, err = proc.communicate()
    finally:
        CHILDREN.discard(proc)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(str(a) for a in args)} exited {proc.returncode}:\n{err}{out}"
        )
    return out


def stop_children() -> None:
    for proc in list(CHILDREN):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)


class Interrupted(Exception):
    pass


def on_signal(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


# ---------------------------------------------------------------------------------------------
# The cluster


class Server:
    """The benchmark's throwaway cluster (testkit.cluster), and what the driver does on it."""

    def __init__(self, cluster: Cluster, settings: list[str], applies: list[Path],
                 release: str | None = None) -> None:
        self.cluster = cluster
        self.release = release  # --release: that release's one-file installs (sql/releases)
        self.settings = settings  # beyond testkit.cluster's (--profile's)
        self.applies = applies  # --apply: run after sql/pgfence.sql in every database
        self.env = cluster.env()

    @property
    def pgbench(self) -> str:
        return self.cluster.tool("pgbench")

    def reaped_cpu(self) -> float:
        """CPU seconds (user + system) of the postmaster's children that have exited. pgbench's
        backends exit when it ends, so the difference across a run is their CPU time (plus any
        autovacuum worker that ended meanwhile): a measure of cost that, unlike throughput,
        hardly moves when other processes take the CPUs for a while."""
        pid = int((self.cluster.dir / "data/postmaster.pid").read_text().split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def wait_for_backends(self, db: str) -> None:
        """Until pgbench's backends have exited (and been counted by reaped_cpu)."""
        with self.connect("postgres") as conn:
            while conn.execute(
                "select count(*) from pg_stat_activity"
                " where datname = %s and application_name = 'pgbench'",
                (db,),
            ).fetchone() != (0,):
                time.sleep(0.02)
        time.sleep(0.05)

    def connect(self, db: str) -> Connection:
        return connect(self.cluster.dsn(db), "bench")

    def psql(self, db: str, file: Path, **variables: object) -> None:
        args: list[str | Path] = []
        for k, v in variables.items():
            args += ["-v", f"{k}={v}"]
        self.cluster.psql(db, *args, "-f", file)

    def sql(self, db: str, query: str, *params: object) -> list[tuple[object, ...]]:
        with self.connect(db) as conn:
            cur = conn.execute(query, params or None)
            return cur.fetchall() if cur.description else []

    def createdb(self, db: str) -> None:
        self.cluster.create_database(db)
        # Every layer, with what it stands on, for the layers' pairs: the tests' recipe.
        install.install(self.cluster, db, ["all"], release=self.release)
        for file in self.applies:
            self.cluster.psql(db, "--single-transaction", "-f", file)


# ---------------------------------------------------------------------------------------------
# pgbench


@dataclass
class BenchResult:
    tps: float
    transactions: int
    latency_ms: float
    cpu_us: float  # server CPU per transaction (see Server.reaped_cpu)
    latencies_us: list[int] = field(default_factory=list)


def pgbench(
    server: Server,
    db: str,
    script: Path,
    *,
    clients: int = CLIENTS,
    jobs: int = JOBS,
    seconds: float | None = None,
    transactions: int | None = None,
    latencies: bool = False,
    protocol: str = "prepared",
    defines: dict[str, int] | None = None,
) -> BenchResult:
    args = [
        server.pgbench,
        "-n",
        "-M",
        protocol,
        "-c",
        str(clients),
        "-j",
        str(jobs),
        "-f",
        str(script),
    ]
    for k, v in (defines or {}).items():
        args += ["-D", f"{k}={v}"]
    if seconds is not None:
        args += ["-T", str(max(1, round(seconds)))]
    else:
        args += ["-t", str(transactions)]
    with tempfile.TemporaryDirectory(prefix="pgfence-bench-") as tmp:
        if latencies:
            args += ["-l", "--log-prefix", f"{tmp}/tx"]
        cpu_before = server.reaped_cpu()
        out = run([*args, db], env=server.env)
        server.wait_for_backends(db)
        cpu = server.reaped_cpu() - cpu_before
        if "aborted" in out or not re.search(r"number of failed transactions: 0 ", out):
            raise RuntimeError(f"pgbench {script.name}: transactions failed\n{out}")
        values: list[int] = []
        if latencies:
            for f in Path(tmp).glob("tx.*"):
                for line in f.read_text().splitlines():
                    values.append(int(line.split()[2]))
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    n = re.search(r"number of transactions actually processed: (\d+)", out)
    lat = re.search(r"latency average = ([\d.]+) ms", out)
    if not (tps and n and lat):
        raise RuntimeError(f"pgbench {script.name}: cannot read its output\n{out}")
    transactions_done = int(n.group(1))
    return BenchResult(
        float(tps.group(1)),
        transactions_done,
        float(lat.group(1)),
        1e6 * cpu / max(1, transactions_done),
        sorted(values),
    )


def percentile(sorted_values: Sequence[float], p: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]

