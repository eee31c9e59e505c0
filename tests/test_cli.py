"""The pgfence CLI against a real cluster: directly, through PgBouncer, and through the real
Supabase CLI (npm supabase@3.1.0, installed by scripts/setup). A fake `supabase` stands in only
for what the real one cannot be made to do (tests/bin/fake-supabase)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgfence import sql
from pgfence.harness import Database
from tests.support import ROOT

SUPABASE = ROOT / ".tools/node_modules/.bin/supabase"
FAKE = ROOT / "tests/bin/fake-supabase"


@dataclass
class Target:
    db: Database
    url: str
    name: str               # what the CLI shows and --confirm must match
    args: list[str]         # the CLI's target arguments


@dataclass
class Result:
    code: int
    out: str
    err: str

    def doc(self) -> Any:
        return json.loads(self.out)   # --json: exactly one JSON document on stdout


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None,
        stdin: str = "") -> Result:
    p = subprocess.run([sys.executable, "-m", "pgfence.cli", *args], cwd=cwd, input=stdin,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    return Result(p.returncode, p.stdout, p.stderr)


def tcp_url(db: Database, port: str | None = None) -> tuple[str, str]:
    dbname = db.one("select current_database()")
    port = port or os.environ["PGPORT"]
    return f"postgresql://postgres@127.0.0.1:{port}/{dbname}", f"127.0.0.1:{port}/{dbname}"


def seed(db: Database) -> dict[str, bool]:
    db.sql("select pgfence.register('mailer'), pgfence.register('billing', false)")
    return enabled(db)


def enabled(db: Database) -> dict[str, bool]:
    return dict(db.sql("select resource, enabled from pgfence.resources"))


@pytest.fixture(params=["direct", "pgbouncer", "supabase"])
def target(request: pytest.FixtureRequest, db: Database) -> Target:
    if request.param == "pgbouncer":
        url, name = tcp_url(db, str(request.getfixturevalue("pgbouncer")))
        return Target(db, url, name, ["--db-url", url])
    url, name = tcp_url(db)
    if request.param == "direct":
        return Target(db, url, name, ["--db-url", url])
    return Target(db, url, name, ["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={url}"])


# --------------------------------------------------------------------------------------------
# The whole window, every transport


def test_full_cycle(target: Target, tmp_path: Path) -> None:
    before = seed(target.db)
    status = run([*target.args, "--json", "status"], tmp_path)
    assert status.code == 0, status.err
    assert [r["resource"] for r in status.doc()["resources"]] == ["billing", "mailer"]

    prep = run([*target.args, "--json", "workers", "prepare-update", "mailer", "billing",
                "--confirm", target.name], tmp_path)
    assert prep.code == 0, prep.out + prep.err
    doc = prep.doc()
    assert {r["resource"]: r["saved_enabled"] for r in doc["status"]} == before
    assert enabled(target.db) == {"mailer": False, "billing": False}

    watch = run([*target.args, "workers", "update-status", doc["token"]], tmp_path)
    assert watch.code == 0 and "drained" in watch.out

    done = run([*target.args, "--json", "workers", "finish-update", doc["token"],
                "--confirm", target.name], tmp_path)
    assert done.code == 0, done.out
    assert {r["resource"]: r["outcome"] for r in done.doc()["results"]} == {
        "billing": "kept_disabled", "mailer": "restored"}
    assert enabled(target.db) == before


def test_refused_finish_and_conflict(target: Target, tmp_path: Path) -> None:
    seed(target.db)
    unknown = run([*target.args, "workers", "finish-update", str(uuid.uuid4()),
                   "--confirm", target.name], tmp_path)
    assert unknown.code == 1 and "does not exist" in unknown.err
    token = target.db.one("select pgfence.prepare_update(array['mailer'], %s)", (uuid.uuid4(),))
    target.db.sql("select pgfence.set_enabled('mailer', false)")   # an operator, inside it
    conflict = run([*target.args, "--json", "workers", "finish-update", str(token),
                    "--confirm", target.name], tmp_path)
    assert conflict.code == 1
    assert conflict.doc()["results"][0]["outcome"] == "conflict"


def test_status_runs_read_only(target: Target, tmp_path: Path) -> None:
    """Sabotage: make the status query write. A read-only status must be refused for it."""
    seed(target.db)
    target.db.sql("create table pgfence.sabotage (at timestamptz)")
    target.db.sql("""create function pgfence.sabotage() returns boolean language sql as
                     $$ insert into pgfence.sabotage values (now()) returning true $$""")
    target.db.sql("create or replace view pgfence.open_updates as select null::uuid as token, "
                  "null::text[] as resources, null::timestamptz as prepared_at "
                  "where pgfence.sabotage()")
    out = run([*target.args, "status"], tmp_path)
    assert out.code == 1 and "read-only transaction" in out.err
    assert target.db.one("select count(*) from pgfence.sabotage") == 0


# --------------------------------------------------------------------------------------------
# Targets and confirmation


def test_no_target_is_a_usage_error(tmp_path: Path) -> None:
    for args in (["status"], ["workers", "finish-update", str(uuid.uuid4())]):
        out = run(args, tmp_path)
        assert out.code == 2 and "no target" in out.err


def test_bad_usage(tmp_path: Path) -> None:
    assert run(["--db-url", "x", "--supabase", "status"], tmp_path).code == 2
    assert run(["--db-url", "x", "--remote=abc", "status"], tmp_path).code == 2
    assert run(["--supabase", "--remote=bad;ref", "status"], tmp_path).code == 2
    assert run(["status", "--bogus"], tmp_path).code == 2


@pytest.mark.parametrize("how", ["wrong-confirm", "no-tty", "supabase-yes-env"])
def test_mutations_need_confirmation(how: str, db: Database, tmp_path: Path) -> None:
    before = seed(db)
    url, name = tcp_url(db)
    args = ["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={url}",
            "workers", "prepare-update", "mailer"]
    env = {}
    if how == "wrong-confirm":
        args += ["--confirm", "127.0.0.1:1/elsewhere"]
    if how == "supabase-yes-env":
        env = {"SUPABASE_YES": "1", "SUPABASE_ASSUME_YES": "1"}
    out = run(args, tmp_path, env=env)
    assert out.code == 4, out.err
    assert name in out.err
    assert enabled(db) == before
    assert db.one("select count(*) from pgfence.updates") == 0


def test_confirmation_typed_at_a_terminal(db: Database, tmp_path: Path) -> None:
    before = seed(db)
    url, name = tcp_url(db)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pgfence.cli", "--db-url", url, "workers",
                             "prepare-update", "mailer"], cwd=tmp_path, stdin=slave,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen = b""
    while b"Type the target name" not in seen:
        ready, _, _ = select.select([master], [], [], 30)
        assert ready, f"no prompt; saw {seen!r}"
        seen += os.read(master, 1024)
    assert name.encode() in seen
    os.write(master, f"{name}\n".encode())
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    assert proc.returncode == 0, out
    assert enabled(db) == {**before, "mailer": False}


# --------------------------------------------------------------------------------------------
# The Supabase transport's failures


def test_missing_link_and_missing_token_reach_the_operator(db: Database, tmp_path: Path) -> None:
    before = seed(db)
    base = ["--supabase", "--supabase-bin", str(SUPABASE)]
    env = {"SUPABASE_ACCESS_TOKEN": ""}
    unlinked = run([*base, "--remote", "status"], tmp_path, env=env)
    assert unlinked.code == 3 and "ProjectRefNotLinkedError" in unlinked.err
    no_token = run([*base, "--remote=abcdefghijklmnopqrst", "workers", "prepare-update",
                    "mailer", "--confirm", "abcdefghijklmnopqrst"], tmp_path, env=env)
    assert no_token.code == 3 and "Access token not provided" in no_token.err
    assert enabled(db) == before


@pytest.mark.parametrize("mode,expect", [
    ("missing", "not found"),
    ("old", "needs 3.0.0 or newer"),
    ("garbage", "no JSON answer"),
])
def test_supabase_cli_failures_are_transport_failures(mode: str, expect: str, db: Database,
                                                       tmp_path: Path) -> None:
    seed(db)
    url, _ = tcp_url(db)
    binary = str(tmp_path / "nothing-here") if mode == "missing" else str(FAKE)
    out = run(["--supabase", "--supabase-bin", binary, f"--remote={url}", "status"], tmp_path,
              env={"FAKE_SUPABASE_MODE": mode, "FAKE_SUPABASE_REAL": str(SUPABASE)})
    assert out.code == 3 and expect in out.err, out.err


def test_prepare_retries_a_lost_response_with_the_same_request_id(db: Database,
                                                                  tmp_path: Path) -> None:
    before = seed(db)
    url, name = tcp_url(db)
    out = run(["--json", "--supabase", "--supabase-bin", str(FAKE), f"--remote={url}",
               "workers", "prepare-update", "mailer", "billing", "--confirm", name], tmp_path,
              env={"FAKE_SUPABASE_MODE": "die-after-first-write",
                   "FAKE_SUPABASE_REAL": str(SUPABASE),
                   "FAKE_SUPABASE_STATE": str(tmp_path / "state")})
    assert out.code == 0, out.out
    assert (tmp_path / "state").exists(), "the first attempt did not run"
    # One window, holding the real saved values, not the temporary false.
    assert db.one("select count(*) from pgfence.updates") == 1
    assert dict(db.sql("select resource, saved_enabled from pgfence.update_items")) == before


def test_failure_after_prepare_prints_the_way_out(db: Database, tmp_path: Path) -> None:
    seed(db)
    url, name = tcp_url(db)
    out = run(["--supabase", "--supabase-bin", str(FAKE), f"--remote={url}",
               "workers", "prepare-update", "mailer", "--confirm", name], tmp_path,
              env={"FAKE_SUPABASE_MODE": "fail-reads-after-write",
                   "FAKE_SUPABASE_REAL": str(SUPABASE),
                   "FAKE_SUPABASE_STATE": str(tmp_path / "state")})
    token = db.one("select token::text from pgfence.open_updates")
    assert out.code == 3
    assert f"workers finish-update {token} --confirm {name}" in out.err
    assert enabled(db)["mailer"] is False          # stays paused: never resumes by itself


# --------------------------------------------------------------------------------------------
# Input that must never reach SQL or a shell


@pytest.mark.parametrize("bad", ["a'; drop table pgfence.resources; --", "$(touch pwned)",
                                 "a b", "-x", "", "é", "a" * 129, "`id`"])
def test_hostile_resource_names_are_refused(bad: str, db: Database, tmp_path: Path) -> None:
    before = seed(db)
    url, name = tcp_url(db)
    out = run(["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={url}", "workers",
               "prepare-update", "mailer", "--", bad, "--confirm", name], tmp_path)
    assert out.code == 2
    assert enabled(db) == before and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("bad", ["'; select 1; --", "not-a-uuid", "$(id)"])
def test_hostile_tokens_are_refused(bad: str, db: Database, tmp_path: Path) -> None:
    url, _ = tcp_url(db)
    out = run(["--db-url", url, "workers", "update-status", bad], tmp_path)
    assert out.code == 2 and "expected a UUID" in out.err


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_literal_round_trips_any_text(value: str) -> None:
    if "\x00" in value:
        with pytest.raises(sql.BadInput):
            sql.literal(value)
        return
    import psycopg
    with psycopg.connect(f"host={os.environ['PGHOST']} port={os.environ['PGPORT']} "
                         "user=postgres dbname=postgres", autocommit=True) as conn:
        for conforming in ("on", "off"):
            conn.execute(f"set standard_conforming_strings = {conforming}")
            assert conn.execute(f"select {sql.literal(value)}").fetchone() == (value,)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from([*"a'\\$;-/*\n\"é`", "$$", "$q$", "E'", "\\'"]),
                max_size=12).map("".join))
def test_literal_round_trips_through_the_supabase_cli(cluster: None, value: str) -> None:
    out = subprocess.run([str(SUPABASE), "db", "query", "--output-format", "json", "--agent",
                          "no", "--read-only",
                          f"--remote=postgresql://postgres@127.0.0.1:{os.environ['PGPORT']}/postgres",
                          f"select {sql.literal(value)} as v"],
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout) == [{"v": value}]


# --------------------------------------------------------------------------------------------
# Output


def test_no_credentials_in_any_output(db: Database, tmp_path: Path) -> None:
    seed(db)
    dbname = db.one("select current_database()")
    secret = "s3cr3t-Pa55word"
    good = f"postgresql://postgres:{secret}@127.0.0.1:{os.environ['PGPORT']}/{dbname}"
    dead = f"postgresql://postgres:{secret}@127.0.0.1:1/{dbname}"
    outputs = [
        run(["--db-url", good, "status"], tmp_path),
        run(["--db-url", good, "workers", "prepare-update", "mailer",
             "--confirm", f"127.0.0.1:{os.environ['PGPORT']}/{dbname}"], tmp_path),
        run(["--db-url", dead, "status"], tmp_path),
        run(["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={good}", "status"],
            tmp_path),
        run(["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={dead}", "status"],
            tmp_path),
    ]
    assert outputs[2].code == 3 and outputs[4].code == 3
    for out in outputs:
        assert secret not in out.out + out.err


def test_json_errors_are_one_document(tmp_path: Path) -> None:
    out = run(["--json", "status"], tmp_path)
    assert out.code == 2 and out.doc()["exit_code"] == 2 and out.err == ""


def test_help_documents_exit_codes(tmp_path: Path) -> None:
    out = run(["--help"], tmp_path)
    assert out.code == 0
    for line in ("0  done", "1  the database refused", "2  usage", "3  transport",
                 "4  confirmation"):
        assert line in out.out
