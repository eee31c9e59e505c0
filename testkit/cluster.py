"""Throwaway PostgreSQL clusters and PgBouncer in front of them (connections: pgfence.connection).

scripts/pg, the pytest fixtures, the fault campaign and the benchmarks all start their
clusters here, as River's tests share ``riverdbtest``:

    cluster = Cluster.start(["fsync=off"])      # initdb and start, owned by this process
    bouncer = cluster.pgbouncer()               # transaction pooling, inside the cluster's dir
    with connect(cluster.dsn("postgres"), "me") as conn:
        ...
    cluster.remove()                            # the server, its PgBouncers, its dir

    python -m testkit.cluster up [-c name=value ...]   # scripts/pg up: prints shell exports
    python -m testkit.cluster down [DIR]               # scripts/pg down

A cluster lives in a short temp dir, /tmp/pgf.XXXXXXXX (unix socket paths are limited to about
100 bytes), with its unix socket in that dir; initdb and the server run as the postgres user
(``runuser``: PostgreSQL refuses root) on a free loopback port, with
``track_commit_timestamp = on`` (the campaign orders writes by commit time). The dir names the
process that owns the cluster, and every start first removes the clusters whose owner died
without removing them (a killed run). Whatever a cluster's users start inside its dir, PgBouncer
or a test's streaming replica, is stopped with it.

The server's binaries are $PGFENCE_PGBIN's (default Debian's PostgreSQL 15; ``scripts/setup
--bindir N`` names another version's).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType

import psycopg

from pgfence.connection import connect

DEFAULT_PGBIN = "/usr/lib/postgresql/15/bin"
TEMP = Path("/tmp")
PREFIX = "pgf."
LOOPBACK = "127.0.0.1"
USER = "postgres"
# Deno's own binary from npm's platform package (scripts/setup), not npm's .bin/deno shim: the
# Deno client's tests and the workers bench run it beside a cluster.
DENO = Path(__file__).resolve().parent.parent / ".tools/node_modules/@deno/linux-x64-glibc/deno"
# How long a server or PgBouncer may take to start, or to die when killed, before it is called
# broken: a bound for a failure only, long enough for any loaded machine.
STARTED_WITHIN = 300


class ClusterError(RuntimeError):
    """A command a cluster needed failed; the message holds what it printed."""


def free_port() -> int:
    """A loopback port that nothing listens on now (to be bound soon after)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def run(*command: str | Path) -> str:
    """Runs a command; its standard output, or ClusterError with everything it printed."""
    args = [str(c) for c in command]
    out = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise ClusterError(f"{shlex.join(args)} exited {out.returncode}:\n{out.stderr}{out.stdout}")
    return out.stdout


def as_postgres(*command: str | Path) -> str:
    """``run`` as the postgres user, which owns every cluster's files and processes."""
    return run("runuser", "-u", USER, "--", *command)


def default_pgbin() -> Path:
    return Path(os.environ.get("PGFENCE_PGBIN") or DEFAULT_PGBIN)


class Cluster:
    """A running throwaway cluster: its dir (data in ``data/``, the unix socket, the logs),
    its binaries and its port."""

    def __init__(self, dir: Path, pgbin: Path, port: int) -> None:
        self.dir = dir
        self.pgbin = pgbin
        self.port = port

    @classmethod
    def start(cls, settings: Sequence[str] = (), owner: int | None = None,
              pgbin: Path | None = None, initdb: Sequence[str] = ()) -> Cluster:
        """A new cluster, owned by process ``owner`` (default this one), with ``settings``
        (``name=value``) added to postgresql.conf, of the server in ``pgbin`` (default
        ``default_pgbin()``), made by initdb with ``initdb``'s options too."""
        reap_orphans()
        pgbin = pgbin or default_pgbin()
        dir = Path(tempfile.mkdtemp(prefix=PREFIX, dir=TEMP))
        try:
            (dir / "pgbin").write_text(f"{pgbin}\n")
            # Written whole, then renamed: a concurrent reaper never reads half an owner.
            (dir / "owner.new").write_text(f"{owner or os.getpid()}\n")
            (dir / "owner.new").rename(dir / "owner")
            dir.chmod(0o755)
            shutil.chown(dir, USER, USER)
            port = free_port()
            as_postgres(pgbin / "initdb", "-D", dir / "data", "-U", USER, "-A", "trust",
                        "-E", "UTF8", "--locale=C.UTF-8", "--no-sync", *initdb)
            conf = [f"listen_addresses = '{LOOPBACK}'", f"port = {port}",
                    f"unix_socket_directories = '{dir}'", "track_commit_timestamp = on",
                    "max_connections = 200", "log_min_messages = warning"]
            for s in settings:
                name, _, value = s.partition("=")
                conf.append(f"{name} = '{value}'")
            with (dir / "data/postgresql.conf").open("a") as f:
                f.write("".join(f"{line}\n" for line in conf))
            cluster = cls(dir, pgbin, port)
            cluster._pg_ctl("-w", "-t", str(STARTED_WITHIN), "start")
        except BaseException:
            remove(dir)
            raise
        return cluster

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Cluster:
        """The cluster whose exports (``scripts/pg up``) are in ``env``."""
        return cls(Path(env["PGFENCE_CLUSTER"]), Path(env["PGFENCE_PGBIN"]), int(env["PGPORT"]))

    # -- how to reach it -------------------------------------------------------------------
    def exports(self) -> dict[str, str]:
        """The environment that points libpq, psql, Sqitch and pg_prove at this cluster."""
        return {"PGFENCE_CLUSTER": str(self.dir), "PGFENCE_PGBIN": str(self.pgbin),
                "PGHOST": str(self.dir), "PGPORT": str(self.port), "PGUSER": USER,
                "PGDATABASE": "postgres"}

    def env(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        """``base`` with this cluster's exports instead of any other libpq settings, and its
        binaries first on PATH (a matrix run may test a server newer than Debian's client
        tools, and pg_dump refuses those)."""
        env = {k: v for k, v in base.items() if not k.startswith("PG") or k.startswith("PGFENCE_")}
        env.update(self.exports())
        path = base.get("PATH", "")
        if path.split(os.pathsep)[0] != str(self.pgbin):
            path = os.pathsep.join([str(self.pgbin), path])
        env["PATH"] = path
        return env

    def tool(self, name: str) -> str:
        """One of the server's binaries (pg_ctl, pgbench, pg_basebackup, ...)."""
        return str(self.pgbin / name)

    def dsn(self, database: str) -> str:
        """Through the unix socket."""
        return f"host={self.dir} port={self.port} user={USER} dbname={database}"

    def tcp_dsn(self, database: str, port: int | None = None) -> str:
        """Over loopback TCP, to this cluster or to ``port`` (a relay or PgBouncer)."""
        return (f"host={LOOPBACK} port={port or self.port} user={USER} dbname={database} "
                "sslmode=disable")

    # -- what to do with it ----------------------------------------------------------------
    def psql(self, database: str, *args: str | Path) -> str:
        """psql (stopping at the first error) in ``database``; its output."""
        return run(self.tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                   "-d", self.dsn(database), *args)

    def create_database(self, name: str, template: str | None = None) -> None:
        # A clone copies the template's files (FILE_COPY), not every block through the WAL
        # (WAL_LOG, the default since 15): 80 against 290 ms a clone of the test template,
        # measured alone on 15 with fsync off (within a whole suite run, where each FILE_COPY
        # also checkpoints, the difference was lost in the noise).
        clone = f' template "{template}" strategy file_copy' if template else ""
        with connect(self.dsn("postgres"), "pgfence-cluster") as conn:
            conn.execute(f'create database "{name}"{clone}')

    def drop_database(self, name: str) -> None:
        with connect(self.dsn("postgres"), "pgfence-cluster") as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')

    def restart(self) -> None:
        """A crash and restart of the server: every backend dies, recovery replays the WAL."""
        self._pg_ctl("-m", "immediate", "-w", "-t", str(STARTED_WITHIN), "restart")

    def stop(self) -> None:
        """A clean shutdown (a checkpoint first): pg_upgrade and file copies need one."""
        self._pg_ctl("-m", "fast", "-w", "-t", str(STARTED_WITHIN), "stop")

    def resume(self) -> None:
        """Starts the server of a stopped cluster again."""
        self._pg_ctl("-w", "-t", str(STARTED_WITHIN), "start")

    def pgbouncer(self) -> PgBouncer:
        return PgBouncer.start(self)

    def remove(self) -> None:
        remove(self.dir)

    def _pg_ctl(self, *args: str) -> None:
        # -l: the postmaster writes to the log, not to a pipe of ours that would never close.
        log = self.dir / "server.log"
        try:
            as_postgres(self.tool("pg_ctl"), "-D", self.dir / "data", "-l", log, *args)
        except ClusterError as e:
            tail = log.read_text()[-4000:] if log.exists() else ""
            raise ClusterError(f"{e}\n{log}:\n{tail}") from None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.remove()


class PgBouncer:
    """PgBouncer in transaction pooling mode in front of a cluster, from a dir inside the
    cluster's (so that removing the cluster stops it), run as postgres (it refuses root).

    Every database of the cluster is reachable through it; database ``single`` is a pool of one
    server connection, to show that clients really share backends.
    """

    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.port = port

    @classmethod
    def start(cls, cluster: Cluster) -> PgBouncer:
        home = Path(tempfile.mkdtemp(prefix="pgbouncer.", dir=cluster.dir))
        port = free_port()
        server = f"host={cluster.dir} port={cluster.port}"
        (home / "users.txt").write_text(f'"{USER}" ""\n')
        # server_login_retry: after a restart, try the server again within a second, not 15.
        (home / "pgbouncer.ini").write_text(f"""[databases]
single = {server} dbname=postgres pool_size=1
* = {server}

[pgbouncer]
listen_addr = {LOOPBACK}
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {home}/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
server_login_retry = 1
logfile = {home}/pgbouncer.log
pidfile = {home}/pgbouncer.pid
""")
        run("chown", "-R", f"{USER}:", home)
        bouncer = cls(home, port)
        bouncer._run()
        return bouncer

    def _run(self) -> None:
        """Starts the daemon; returns once it accepts connections."""
        as_postgres("pgbouncer", "-d", "-q", self.home / "pgbouncer.ini")
        # Bounds for a failure only: a start that a loaded machine delays is not one (10 s,
        # 2 s a try, raced a restart in the middle of a client fault test).
        deadline = time.monotonic() + STARTED_WITHIN
        while True:
            try:
                connect(self.dsn("postgres"), "pgfence-cluster", timeout=30).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)             # start-up poll; no verdict depends on it

    def dsn(self, database: str) -> str:
        return f"host={LOOPBACK} port={self.port} user={USER} dbname={database} sslmode=disable"

    def stop(self) -> None:
        _kill(self.home / "pgbouncer.pid")

    def restart(self) -> None:
        """A crash and restart: PgBouncer is killed (SIGKILL: every client and server
        connection drops at once), then started again on the same port with the same settings;
        returns once it accepts connections."""
        pidfile = self.home / "pgbouncer.pid"
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STARTED_WITHIN
        while _running(pid):
            if time.monotonic() > deadline:
                raise ClusterError(f"PgBouncer {pid} did not die")
            time.sleep(0.005)                # kill poll; no verdict depends on it
        # A killed PgBouncer leaves its pidfile, and refuses to start while that pid exists
        # (kill(pid, 0) succeeds for a zombie too).
        pidfile.unlink()
        self._run()


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs: a zombie (dead, its sockets closed, waiting for its
    parent, here often a slow-reaping init, to reap it) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _kill(pidfile: Path) -> None:
    with suppress(OSError, ValueError, IndexError):     # gone already
        os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)


def stop_server(pgbin: Path, data: Path) -> None:
    """Stops the server of data dir ``data`` at once (pg_ctl -m immediate), if it runs."""
    with suppress(ClusterError):
        as_postgres(pgbin / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")


def remove(dir: Path) -> None:
    """Stops every PgBouncer and server inside a cluster's dir, then removes it."""
    if not dir.is_dir():
        return
    for pidfile in dir.glob("pgbouncer.*/pgbouncer.pid"):
        _kill(pidfile)
    try:
        pgbin = Path((dir / "pgbin").read_text().strip())
    except OSError:
        pgbin = default_pgbin()
    # The cluster's data dir, and any other server started inside its dir (a test's replica).
    for pidfile in dir.glob("*/postmaster.pid"):
        stop_server(pgbin, pidfile.parent)
    shutil.rmtree(dir, ignore_errors=True)


def reap_orphans() -> None:
    """Removes the clusters whose owning process has died."""
    for dir in TEMP.glob(f"{PREFIX}*"):
        try:
            owner = int((dir / "owner").read_text())
        except (OSError, ValueError):
            continue                          # not a cluster, or one still being made
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            remove(dir)
        except PermissionError:
            pass                              # alive, someone else's


USAGE = "usage: scripts/pg up [-c name=value ...] | scripts/pg down [DIR]"


def main(argv: Sequence[str]) -> int:
    """scripts/pg: ``up`` prints the cluster's exports for ``eval``; the owner is
    $PGFENCE_OWNER_PID, else the calling process. ``down`` removes DIR, else
    $PGFENCE_CLUSTER."""
    command, args = (argv[0], list(argv[1:])) if argv else ("", [])
    try:
        if command == "up":
            settings = []
            while args:
                if args[0] != "-c" or len(args) < 2:
                    print(f"scripts/pg up: unknown argument {args[0]}", file=sys.stderr)
                    return 2
                settings.append(args[1])
                args = args[2:]
            owner = int(os.environ.get("PGFENCE_OWNER_PID") or os.getppid())
            cluster = Cluster.start(settings, owner)
            print("".join(f"export {k}={shlex.quote(v)}\n" for k, v in cluster.exports().items()),
                  end="")
            return 0
        if command == "down" and len(args) <= 1:
            target = args[0] if args else os.environ.get("PGFENCE_CLUSTER")
            if not target:
                print("scripts/pg down: no cluster given", file=sys.stderr)
                return 2
            remove(Path(target))
            return 0
    except ClusterError as e:
        print(e, file=sys.stderr)
        return 1
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
