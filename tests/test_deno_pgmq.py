"""The Deno client's fenced pgmq consumer (clients/deno/pgmq_test.ts, `PgmqWorker`): its tests
run by `deno test` against a fresh database with the real pgmq and pgfence's pgmq layer,
directly and through PgBouncer in transaction pooling mode. The negative control is in the
file (a worker that starts every message of a batch runs a handler twice)."""

from __future__ import annotations

import re

from psycopg.conninfo import conninfo_to_dict

from testkit.cluster import Cluster, PgBouncer
from testkit.harness import Database
from tests.support import DenoServer, refuses_what_is_not_a_fresh_invocation
from tests.test_deno_client import CLIENT, PERMISSIONS, deno, url


def test_deno_pgmq_worker_tests_pass_directly_and_through_pgbouncer(
        mq: Database, cluster: Cluster, bouncer: PgBouncer, deno_env: dict[str, str]) -> None:
    name = conninfo_to_dict(mq.dsn)["dbname"]
    assert isinstance(name, str)
    env = {**deno_env, "PGFENCE_DENO_DIRECT_URL": url(cluster.port, name),
           "PGFENCE_DENO_BOUNCER_URL": url(bouncer.port, name)}
    out = deno(env, "test", *PERMISSIONS, "pgmq_test.ts")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    summary = re.search(r"^ok \| (\d+) passed \| 0 failed(?: \| (\d+) ignored)?", text, re.M)
    # Nine tests, each directly and through PgBouncer; none ignored.
    assert summary and int(summary.group(1)) == 18 and summary.group(2) in (None, "0"), text


def test_the_pgmq_example_follows_its_handshake(
        mq: Database, cluster: Cluster, deno_env: dict[str, str]) -> None:
    """examples/pgmq_edge_function.ts: a fresh invocation id starts one worker, which reads the
    queue through the layer until idle and releases; anything else is refused, nothing acquired
    (0.2.1's example started a worker for a request without an id, and answered a malformed
    body with 500)."""
    name = conninfo_to_dict(mq.dsn)["dbname"]
    assert isinstance(name, str)
    mq.sql("select pgfence.register('jobs-worker')")
    mq.sql("select pgmq.create('jobs')")
    mq.sql("select pgmq.send('jobs', '{\"n\": 1}')")
    server = DenoServer("examples/pgmq_edge_function.ts", CLIENT,
                        {**deno_env, "DATABASE_URL": url(cluster.port, name)})
    try:
        refuses_what_is_not_a_fresh_invocation(server)
        assert mq.one("select count(*) from pgfence.leases") == 0, "nothing was acquired"
        invocation = str(mq.one("select pgfence.request_start('jobs-worker')"))
        # The worker is held inside its archive (a session holds the archive table), so that it
        # is surely current while the invocation is delivered again.
        holder = mq.session("holder")
        holder.begin()
        holder.run("lock table pgmq.a_jobs in exclusive mode")
        status, said = server.post({"invocation_id": invocation})
        assert status == 202 and said["started"] is True, said
        mq.wait_until("select count(*) = 1 from pg_stat_activity "
                      "where %s = any(pg_blocking_pids(pid))", (holder.pid,))
        assert server.post({"invocation_id": invocation}) == (409, {"started": False}), \
            "a replayed invocation starts nothing while its worker is current"
        holder.commit()
        mq.wait_until("select count(*) = 1 from pgfence.lease_status where status = 'released'")
        assert mq.one("select count(*) from pgmq.a_jobs") == 1, "the message was archived"
        assert mq.one("select count(*) from pgfence.leases") == 1
    finally:
        server.kill()
