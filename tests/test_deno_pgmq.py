"""The Deno client's fenced pgmq consumer (clients/deno/pgmq_test.ts, `PgmqWorker`): its tests
run by `deno test` against a fresh database with the real pgmq and pgfence's pgmq layer,
directly and through PgBouncer in transaction pooling mode. The negative control is in the
file (a worker that starts every message of a batch runs a handler twice)."""

from __future__ import annotations

import re

from psycopg.conninfo import conninfo_to_dict

from testkit.cluster import Cluster, PgBouncer
from testkit.harness import Database
from tests.test_deno_client import PERMISSIONS, deno, url


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
    # Six tests, each directly and through PgBouncer; none ignored.
    assert summary and int(summary.group(1)) == 12 and summary.group(2) in (None, "0"), text
