"""The Deno client (clients/deno): deno fmt, lint and check clean, with negative controls; then
its own tests (`deno test`) against a fresh database of this run's cluster, reached directly
and through PgBouncer in transaction pooling mode; and docs/deno.md's example, through PgBouncer.

Deno and postgres.js are the versions pinned in .tools/package.json, installed by scripts/setup
from npm. Each run gets an empty DENO_DIR, so nothing is found in a cache of an earlier run: the
client resolves postgres.js from .tools/node_modules (clients/deno/deno.json), offline.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from pgfence.cluster import LOOPBACK, USER, Cluster, PgBouncer
from pgfence.harness import Database
from tests.support import ROOT
from tests.test_docs import example

CLIENT = ROOT / "clients/deno"
DENO = ROOT / ".tools/node_modules/@deno/linux-x64-glibc/deno"
# What the tests need and no more: the cluster and PgBouncer on loopback, their own env
# variables, and the files of the client and of postgres.js.
PERMISSIONS = ["--allow-net=" + LOOPBACK, "--allow-env", "--allow-read", "--allow-sys"]


@pytest.fixture(scope="session")
def deno_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A clean environment: no PG* settings or secrets of ours, a DENO_DIR of this run."""
    if not os.access(DENO, os.X_OK):
        pytest.fail(f"{DENO} is missing: run scripts/setup")
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ROOT),
            "DENO_DIR": str(tmp_path_factory.mktemp("deno-dir")), "NO_COLOR": "1",
            "DENO_NO_UPDATE_CHECK": "1"}


def deno(env: dict[str, str], *args: str, cwd: Path = CLIENT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DENO), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_fmt_lint_and_check_are_clean(deno_env: dict[str, str]) -> None:
    for args in (["fmt", "--check"], ["lint"], ["check", "mod.ts", "client_test.ts"]):
        out = deno(deno_env, *args)
        assert out.returncode == 0, f"deno {' '.join(args)}:\n{out.stdout}{out.stderr}"


def test_negative_control_fmt_lint_and_check_catch_a_bad_file(
        deno_env: dict[str, str], tmp_path: Path) -> None:
    """They look at the files: a badly formatted, lint-failing, ill-typed one is refused."""
    bad = tmp_path / "bad.ts"
    bad.write_text('var unused   = 1\nconst n: number = "one";\nexport { n }\n')
    for args, said in ((["fmt", "--check"], "Found 1 not formatted file"),
                       (["lint"], "no-var"), (["check"], "TS2322")):
        out = deno(deno_env, *args, str(bad), cwd=tmp_path)
        assert out.returncode != 0 and said in out.stdout + out.stderr, out.stdout + out.stderr


def url(port: int, database: str) -> str:
    return f"postgres://{USER}@{LOOPBACK}:{port}/{database}"


@pytest.fixture
def deno_test(db: Database, cluster: Cluster, bouncer: PgBouncer,
              deno_env: dict[str, str]) -> Iterator[subprocess.CompletedProcess[str]]:
    name = conninfo_to_dict(db.dsn)["dbname"]
    assert isinstance(name, str)
    env = {**deno_env, "PGFENCE_DENO_DIRECT_URL": url(cluster.port, name),
           "PGFENCE_DENO_BOUNCER_URL": url(bouncer.port, name)}
    yield deno(env, "test", *PERMISSIONS, "client_test.ts")


def test_deno_client_tests_pass_directly_and_through_pgbouncer(
        deno_test: subprocess.CompletedProcess[str]) -> None:
    out = deno_test.stdout + deno_test.stderr
    assert deno_test.returncode == 0, out
    summary = re.search(r"^ok \| (\d+) passed \| 0 failed(?: \| (\d+) ignored)?", out, re.M)
    assert summary and summary.group(2) in (None, "0"), out
    results = re.findall(r"^(.+) \[(direct|pgbouncer)\] \.\.\. (\w+)", out, re.M)
    passed = [(name, target) for name, target, verdict in results if verdict == "ok"]
    direct = {name for name, target in passed if target == "direct"}
    through = {name for name, target in passed if target == "pgbouncer"}
    # Every test of the pooler's kind ran through PgBouncer as well as directly.
    assert direct and through == direct, out


def test_docs_example_works_the_queue_through_pgbouncer(
        db: Database, bouncer: PgBouncer, deno_env: dict[str, str], tmp_path: Path) -> None:
    db.sql("select pgfence.register('mailer')")
    for to in ("ada@example.org", "grace@example.org"):
        db.sql("select pgfence.enqueue('emails', jsonb_build_object('to', %s::text))", (to,))
    script = tmp_path / "worker.ts"
    script.write_text(example("docs/deno.md", "deno example", "ts"))
    name = conninfo_to_dict(db.dsn)["dbname"]
    assert isinstance(name, str)
    for args in (["fmt", "--check", "--line-width", "100"], ["lint"]):   # as clients/deno's
        out = deno(deno_env, *args, str(script), cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
    env = {**deno_env, "DATABASE_URL": url(bouncer.port, name)}
    out = deno(env, "run", "--check", "--config", str(CLIENT / "deno.json"), *PERMISSIONS,
               str(script))
    assert out.returncode == 0, out.stdout + out.stderr
    assert db.sql("select state, result->>'to' from pgfence.tasks order by task_id") == [
        ("completed", "ada@example.org"), ("completed", "grace@example.org")]
    assert db.one("select status from pgfence.lease_status") == "released"
