"""`pgfence doctor` prints pgfence.health()'s checks over both transports (a direct connection,
the real Supabase CLI), only reads, exits 1 when a check fails, and says the same in --json.
The checks themselves are tests/test_health.py's, on every server version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.harness import Database
from tests.support import HUNG, SUPABASE
from tests.test_health import BREAKS, healthy


def doctor(db: Database, how: str, *args: str) -> subprocess.CompletedProcess[str]:
    dbname = db.one("select current_database()")
    url = f"postgresql://postgres@127.0.0.1:{os.environ['PGPORT']}/{dbname}"
    target = (["--db-url", url] if how == "direct" else
              ["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={url}"])
    return subprocess.run([sys.executable, "-m", "pgfence.cli", *target, "doctor", *args],
                          capture_output=True, text=True, timeout=HUNG, cwd=Path("/tmp"))


@pytest.mark.parametrize("how", ["direct", "supabase"])
def test_doctor_on_a_healthy_and_a_broken_database(db: Database, how: str) -> None:
    healthy(db)
    ok = doctor(db, how)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "healthy" in ok.stdout and "schema matches its release" in ok.stdout
    print(ok.stdout)
    BREAKS["schema matches its release"][0](db)
    BREAKS["protections guard every write"][0](db)
    broken = doctor(db, how)
    print(broken.stdout)
    assert broken.returncode == 1
    assert "function pgfence.version() changed" in broken.stdout
    assert "2 of 10 checks failed" in broken.stdout   # 9 of health(), the release row
    doc = json.loads(doctor(db, how, "--json").stdout)
    assert doc["ok"] is False
    assert [c["check"] for c in doc["checks"] if c["status"] == "failed"] == [
        "schema matches its release", "protections guard every write"]


def test_doctor_only_reads(db: Database) -> None:
    healthy(db)
    dbname = db.one("select current_database()")
    db.sql(f"alter database {dbname} set default_transaction_read_only = on")
    try:
        out = doctor(db, "direct")
    finally:
        db.sql(f"alter database {dbname} reset default_transaction_read_only")
    assert out.returncode == 0, out.stdout + out.stderr


def test_doctor_without_health_is_exit_1(db: Database) -> None:
    db.sql("drop function pgfence.health()")
    out = doctor(db, "direct")
    assert out.returncode == 1 and "has no pgfence.health()" in out.stderr


def plain(db: Database) -> None:
    """Healthy but for pg_cron, which plain PostgreSQL does not have."""
    healthy(db)
    db.sql("drop schema cron cascade")


@pytest.mark.parametrize("how", ["direct", "supabase"])
def test_without_pg_cron_the_requeue_job_is_a_warning(db: Database, how: str) -> None:
    plain(db)
    out = doctor(db, how)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("healthy, 1 warning"), out.stdout
    doc = json.loads(doctor(db, how, "--json").stdout)
    assert doc["ok"] is True and doc["warnings"] == 1
    (requeue,) = [c for c in doc["checks"] if c["check"] == "requeue job scheduled"]
    assert requeue["status"] == "warning" and requeue["ok"] is False
    assert "docs/operations.md#recovering-tasks" in requeue["detail"]
    assert "--requeue-elsewhere" in requeue["detail"]
    assert [c["status"] for c in doc["checks"] if c is not requeue] == ["ok"] * 9


@pytest.mark.parametrize("how", ["direct", "supabase"])
def test_requeue_scheduled_elsewhere_is_healthy(db: Database, how: str) -> None:
    plain(db)
    out = doctor(db, how, "--requeue-elsewhere")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("\n\nhealthy"), out.stdout
    assert "runs on a schedule other than pg_cron's" in out.stdout
    # Negative control: the operator's word covers the requeue job, nothing else.
    BREAKS["protections guard every write"][0](db)
    broken = doctor(db, how, "--requeue-elsewhere", "--json")
    assert broken.returncode == 1
    doc = json.loads(broken.stdout)
    assert [c["check"] for c in doc["checks"] if c["status"] == "failed"] == [
        "protections guard every write"]


def test_with_pg_cron_and_no_job_the_check_still_fails(db: Database) -> None:
    healthy(db)
    BREAKS["requeue job scheduled"][0](db)
    out = doctor(db, "direct", "--json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert [c["check"] for c in doc["checks"] if c["status"] == "failed"] == [
        "requeue job scheduled"]
    assert doctor(db, "direct", "--requeue-elsewhere").returncode == 0
