"""The pgfence CLI against a real cluster: directly, through PgBouncer, and through the real
Supabase CLI (npm supabase@3.1.0, installed by scripts/setup). A fake `supabase` stands in only
for what the real one cannot be made to do (tests/bin/fake-supabase), and records, around the
real one, what pgfence hands to it (FAKE_SUPABASE_RECORD)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgfence import sql
from pgfence.connection import connect
from testkit.cluster import Cluster, free_port
from testkit.harness import HANG, Database
from tests.support import HUNG, ROOT, SUPABASE

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
                       capture_output=True, text=True, timeout=HUNG,
                       env={**os.environ, **(env or {})})
    return Result(p.returncode, p.stdout, p.stderr)


@dataclass
class Call:
    """One call of the Supabase CLI, as the recording wrapper saw it, and the real CLI's answer."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    exit: int | None = None
    stdout: str = ""


def recording(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """Target arguments and environment that run the real Supabase CLI through the recording
    wrapper, and the file it records to."""
    log = tmp_path / "supabase-calls.jsonl"
    return (["--supabase", "--supabase-bin", str(FAKE)],
            {"FAKE_SUPABASE_REAL": str(SUPABASE), "FAKE_SUPABASE_RECORD": str(log)}, log)


def recorded(log: Path) -> list[Call]:
    calls: list[Call] = []
    for line in log.read_text().splitlines() if log.exists() else []:
        entry = json.loads(line)
        if "env" in entry:
            calls.append(Call(entry["argv"], entry["env"], entry["cwd"]))
        else:
            calls[-1].exit, calls[-1].stdout = entry["exit"], entry["stdout"]
    return calls


def queries(calls: list[Call]) -> list[Call]:
    return [c for c in calls if c.argv[:2] == ["db", "query"] and "--help" not in c.argv]


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


@pytest.mark.parametrize("pgflow_version", ["0.14.1"])
@pytest.mark.parametrize("how", ["direct", "supabase"])
def test_a_window_over_an_unconverted_pgflow_function_shows_its_workers(
        flow: Database, flow_cluster: Cluster, how: str, tmp_path: Path) -> None:
    """update_status's rows of a pgflow worker function whose workers are pgflow's own (issue
    41), with its workers, through both transports the same way."""
    flow.sql("select pgflow.track_worker_function('plain')")
    flow.sql("update pgflow.worker_functions set debounce = interval '10 minutes'")
    worker = flow.one("insert into pgflow.workers (worker_id, queue_name, function_name) "
                      "values (gen_random_uuid(), 'q', 'plain') returning worker_id")
    dbname = flow.one("select current_database()")
    url, name = f"postgresql://postgres@127.0.0.1:{flow_cluster.port}/{dbname}", \
        f"127.0.0.1:{flow_cluster.port}/{dbname}"
    args = (["--db-url", url] if how == "direct"
            else ["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={url}"])
    prep = run([*args, "--json", "workers", "prepare-update", "plain", "--confirm", name],
               tmp_path)
    assert prep.code == 0, prep.out + prep.err
    [row] = prep.doc()["status"]
    assert (row["resource"], row["saved_enabled"], row["enabled"], row["verdict"]) == \
        ("plain", True, False, "draining"), row
    [seen] = row["workers"]
    assert (seen["worker_id"], seen["live"], seen["started_tasks"]) == (str(worker), True, 0)
    human = run([*args, "workers", "update-status", prep.doc()["token"]], tmp_path)
    assert human.code == 0 and str(worker) in human.out and "draining" in human.out, human.out
    done = run([*args, "--json", "workers", "finish-update", prep.doc()["token"],
                "--confirm", name], tmp_path)
    assert done.doc()["results"] == [{"resource": "plain", "enabled": True,
                                      "outcome": "restored"}], done.out


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


def test_status_shows_protections_that_stopped_protecting(target: Target, tmp_path: Path) -> None:
    seed(target.db)
    target.db.sql("create table guarded (id int)")
    target.db.sql("select pgfence.protect('guarded', 'mailer')")
    healthy = run([*target.args, "--json", "status"], tmp_path)
    assert healthy.code == 0 and healthy.doc()["protection_problems"] == []
    target.db.sql("alter table guarded disable trigger pgfence_guard")
    out = run([*target.args, "--json", "status"], tmp_path)
    assert out.code == 0
    assert out.doc()["protection_problems"] == [
        {"table_name": "guarded", "resources": "mailer", "mode": "enforce",
         "problem": "the guard trigger is disabled"}]
    human = run([*target.args, "status"], tmp_path)
    assert "protections that stopped protecting" in human.out
    assert "the guard trigger is disabled" in human.out


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
    out, _ = proc.communicate(timeout=HUNG)
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
    assert unlinked.code == 3 and "no linked project" in unlinked.err, unlinked.err
    no_token = run([*base, "--remote=abcdefghijklmnopqrst", "workers", "prepare-update",
                    "mailer", "--confirm", "abcdefghijklmnopqrst"], tmp_path, env=env)
    assert no_token.code == 3 and "Access token not provided" in no_token.err
    assert enabled(db) == before


@pytest.mark.parametrize("mode,expect", [
    ("missing", "not found"),
    ("old", "needs 3.0.0 or newer"),
    ("no-read-only", "lacks --read-only, which pgfence needs"),
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


@settings(max_examples=4, deadline=None)
@given(st.lists(st.lists(st.sampled_from([*"a'\\$;-/*\n\"é`", "$$", "$q$", "E'", "\\'"]),
                         max_size=12).map("".join), min_size=1, max_size=30))
def test_literal_round_trips_through_the_supabase_cli(cluster: None, values: list[str]) -> None:
    """Many values per call: each Supabase CLI call costs over a second of CPU."""
    columns = ", ".join(f"{sql.literal(v)} as v{i}" for i, v in enumerate(values))
    out = subprocess.run([str(SUPABASE), "db", "query", "--output-format", "json", "--agent",
                          "no", "--read-only",
                          f"--remote=postgresql://postgres@127.0.0.1:{os.environ['PGPORT']}/postgres",
                          f"select {columns}"],
                         capture_output=True, text=True, timeout=HUNG)
    assert json.loads(out.stdout) == [{f"v{i}": v for i, v in enumerate(values)}]


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


# --------------------------------------------------------------------------------------------
# Credentials: every way libpq carries a secret, and none of them shows or reaches an argv

SECRET = "s3cr3t@Pa55/w0rd"            # a URL must percent-encode it
KEY_SECRET = "k3y-Pa55phrase"
PLACEHOLDER = {"direct": '--db-url "$DATABASE_URL"',
               "supabase": f'--supabase --remote="$DATABASE_URL" --supabase-bin {FAKE}'}
FORMS = ["userinfo", "query", "sslpassword", "passfile", "keyvalue", "pgpassword-env"]


@pytest.fixture(scope="session")
def password_role(cluster: Cluster) -> Iterator[str]:
    """A superuser that logs in over TCP only with SECRET (scram-sha-256): a run that works
    proves the password reached the server by the way under test."""
    role = f"pgfence_pw_{uuid.uuid4().hex[:8]}"
    hba = cluster.dir / "data/pg_hba.conf"
    original = hba.read_text()
    with connect(cluster.dsn("postgres"), "pgfence-tests") as conn:
        conn.execute(f"create role {role} login superuser password {sql.literal(SECRET)}")
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
        conn.execute("select pg_reload_conf()")
    try:
        # The postmaster reloads pg_hba.conf in its own time, later on a loaded machine: the
        # bound is a hung test's (200 tries, 10 s and more, was a race with that reload).
        deadline = time.monotonic() + HANG
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={cluster.port} dbname=postgres "
                                f"user={role} passfile=/dev/null", connect_timeout=60).close()
            except psycopg.OperationalError as e:
                if "password" in str(e):
                    break
            if time.monotonic() > deadline:
                raise AssertionError("the server never asked for the password")
            time.sleep(0.05)
        yield role
    finally:
        hba.write_text(original)
        with connect(cluster.dsn("postgres"), "pgfence-tests") as conn:
            conn.execute("select pg_reload_conf()")
            conn.execute(f"drop role if exists {role}")


def secret_form(how: str, role: str, hostport: str, dbname: str,
                tmp_path: Path) -> tuple[str, dict[str, str], list[str], list[str]]:
    """(URL or conninfo string, environment, the secrets, and what else must never be shown:
    every connection parameter but host, port and database)."""
    encoded = quote(SECRET, safe="")
    secrets = [SECRET, encoded]
    host, _, port = hostport.partition(":")
    if how == "userinfo":
        return f"postgresql://{role}:{encoded}@{hostport}/{dbname}", {}, secrets, []
    if how == "query":
        return f"postgresql://{role}@{hostport}/{dbname}?password={encoded}", {}, secrets, []
    if how == "sslpassword":
        return (f"postgresql://{role}:{encoded}@{hostport}/{dbname}?sslpassword={KEY_SECRET}",
                {}, [*secrets, KEY_SECRET], [])
    if how == "passfile":
        passfile = tmp_path / f"secret-pgpass-{port}"
        passfile.write_text(f"{host}:{port}:*:{role}:{SECRET}\n")
        passfile.chmod(0o600)
        return (f"postgresql://{role}@{hostport}/{dbname}?passfile={passfile}", {}, secrets,
                [str(passfile)])
    if how == "keyvalue":
        return (f"host={host} port={port} dbname={dbname} user={role} password='{SECRET}'", {},
                secrets, [])
    assert how == "pgpassword-env"
    return f"postgresql://{role}@{hostport}/{dbname}", {"PGPASSWORD": SECRET}, secrets, []


@pytest.mark.parametrize("transport", ["direct", "supabase"])
@pytest.mark.parametrize("how", FORMS)
def test_no_secret_in_any_output_or_argv(how: str, transport: str, password_role: str,
                                         db: Database, tmp_path: Path) -> None:
    """Every command that prints a command to run next (finish-update after prepare, the retry
    of a prepare whose answer was lost, install after version, ...) names the target without
    its URL, with a placeholder; the Supabase CLI gets the password in PGPASSWORD, never on its
    argv (which any user can read in ps)."""
    seed(db)
    port, dbname = os.environ["PGPORT"], str(db.one("select current_database()"))
    name = f"127.0.0.1:{port}/{dbname}"
    url, env, secrets, parameters = secret_form(how, password_role, f"127.0.0.1:{port}",
                                                dbname, tmp_path)
    dead = secret_form(how, password_role, "127.0.0.1:1", dbname, tmp_path)[0]
    log = tmp_path / "no-supabase-calls"
    if transport == "direct":
        target, dead_target = ["--db-url", url], ["--db-url", dead]
    else:
        base, recorder, log = recording(tmp_path)
        target, dead_target = [*base, f"--remote={url}"], [*base, f"--remote={dead}"]
        env = {**env, **recorder}
    shown = PLACEHOLDER[transport]
    results: list[Result] = []

    def pgfence(*words: str, at: list[str] = target) -> Result:
        results.append(run([*at, *words], tmp_path, env=env))
        return results[-1]

    refused = transport == "supabase" and how in ("sslpassword", "keyvalue")
    if refused:
        # Refused before anything runs: the Supabase CLI could only get these on its argv.
        as_json = pgfence("--json", "workers", "prepare-update", "mailer", "--confirm", name)
        assert as_json.code == 2 and as_json.err == "", as_json.out + as_json.err
        assert as_json.doc()["exit_code"] == 2
        human = pgfence("status")
        assert human.code == 2 and "--remote" in human.err, human.err
        assert queries(recorded(log)) == []
    else:
        prep = pgfence("--json", "workers", "prepare-update", "mailer", "--confirm", name)
        assert prep.code == 0, prep.out + prep.err
        token = prep.doc()["token"]
        assert prep.doc()["target"] == name
        assert prep.doc()["finish"] == (f"pgfence {shown} workers finish-update {token} "
                                        f"--confirm {name}")
        done = pgfence("workers", "finish-update", token, "--confirm", name)
        assert done.code == 0 and "restored" in done.out, done.out + done.err
        again = pgfence("workers", "prepare-update", "billing", "--confirm", name)
        assert again.code == 0, again.out + again.err
        assert f"pgfence {shown} workers finish-update " in again.out
        lost = pgfence("workers", "prepare-update", "mailer", "--confirm",
                       f"127.0.0.1:1/{dbname}", at=dead_target)
        assert lost.code == 3, lost.err
        assert f"pgfence {shown} workers prepare-update mailer --request-id " in lost.err
        db.sql("drop schema pgfence cascade")
        version = pgfence("version")
        assert version.code == 0, version.err
        assert f"to install: pgfence {shown} install --confirm {name}" in version.out
        upgrade = pgfence("--json", "upgrade", "--confirm", name)
        assert upgrade.code == 1 and upgrade.err == ""
        assert f"run install: pgfence {shown} install" in upgrade.doc()["error"]
    for result in results:
        for text in (result.out, result.err):
            for never in [*secrets, *parameters, "postgresql://", "password=", "passfile=",
                          "sslpassword="]:
                assert never not in text, (never, text)
    if transport == "supabase":
        calls = recorded(log)
        assert refused or calls, "the recorder saw no call"
        for call in calls:
            for secret in secrets:
                assert not any(secret in arg for arg in call.argv), call.argv
                assert {k for k, v in call.env.items() if secret in v} <= {"PGPASSWORD"}
        if how != "passfile" and queries(calls):
            # The password traveled, and only, in PGPASSWORD: the server demands it.
            assert all(c.env.get("PGPASSWORD") == SECRET for c in queries(calls))


@pytest.mark.parametrize("transport", ["direct", "supabase"])
def test_negative_control_the_password_role_needs_its_password(
        transport: str, password_role: str, db: Database, tmp_path: Path) -> None:
    """Without the password, the same target fails: so the runs above that worked got the
    password through the way they were given it (for Supabase: PGPASSWORD, not argv)."""
    port, dbname = os.environ["PGPORT"], db.one("select current_database()")
    url = f"postgresql://{password_role}@127.0.0.1:{port}/{dbname}"
    wrong = f"postgresql://{password_role}:wrong-{uuid.uuid4().hex[:6]}@127.0.0.1:{port}/{dbname}"
    for attempt in (url, wrong):
        args = (["--db-url", attempt] if transport == "direct"
                else ["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={attempt}"])
        out = run([*args, "status"], tmp_path, env={"PGPASSFILE": "/dev/null"})
        assert out.code == 3, out.out + out.err
        assert "password" in out.err


def test_a_conninfo_string_names_its_target_as_libpq_resolves_it(db: Database,
                                                                  tmp_path: Path) -> None:
    """What the string leaves out comes from PGHOST and PGPORT, for the name shown and
    confirmed as for the connection; a service file's choice cannot be shown, so is refused."""
    before = seed(db)
    port, dbname = os.environ["PGPORT"], db.one("select current_database()")
    name = f"127.0.0.1:{port}/{dbname}"
    env = {"PGHOST": "127.0.0.1", "PGPORT": port}
    out = run(["--db-url", f"dbname={dbname}", "--json", "workers", "prepare-update", "mailer",
               "--confirm", name], tmp_path, env=env)
    assert out.code == 0 and out.err == "", out.out + out.err
    assert out.doc()["target"] == name
    assert enabled(db) == {**before, "mailer": False}     # the database that was confirmed
    for service in (f"service=pgfence_nowhere dbname={dbname}", f"dbname={dbname}"):
        refused = run(["--db-url", service, "--json", "status"], tmp_path,
                      env={**env, "PGSERVICE": "pgfence_nowhere"})
        assert refused.code == 2 and "service" in refused.doc()["error"], refused.out


# --------------------------------------------------------------------------------------------
# The target the operator confirms is the one the Supabase CLI uses

REF_A, REF_B, REF_C, REF_D = ("a" * 20, "b" * 20, "c" * 20, "d" * 20)
# No test reaches api.supabase.com: a token of the right shape, and a proxy that is not there.
OFFLINE = {"SUPABASE_ACCESS_TOKEN": "sbp_" + "0" * 40, "HTTPS_PROXY": "http://127.0.0.1:1",
           "HTTP_PROXY": "http://127.0.0.1:1", "NO_PROXY": "", "SUPABASE_PROJECT_ID": "",
           "SUPABASE_WORKDIR": ""}


def supabase_project(folder: Path, ref: str | None, config: bool = True) -> tuple[Path, int]:
    """A folder with supabase/config.toml (its own local database port) and, when ref is
    given, the link `supabase link` writes (supabase/.temp/project-ref)."""
    (folder / "supabase/.temp").mkdir(parents=True)
    port = free_port()
    if config:
        (folder / "supabase/config.toml").write_text(f"[db]\nport = {port}\n")
    if ref is not None:
        (folder / "supabase/.temp/project-ref").write_text(f"{ref}\n")
    return folder, port


@dataclass
class Layout:
    cwd: Path
    env: dict[str, str]
    ref: str            # the project the Supabase CLI 3.1.0 uses for --remote
    workdir: Path       # the folder whose supabase/ it reads
    local_port: int     # the local database port of that folder's config


def layout(root: Path, case: str) -> Layout:
    """a/ is a project linked to REF_A; a/b/ holds a stray link (REF_D) without a config, which
    the Supabase CLI does not take for a project (pgfence used to); o/ is a project linked to
    REF_C; n/ a project that is not linked."""
    a, a_port = supabase_project(root / "a", REF_A)
    b, _ = supabase_project(root / "a/b", REF_D, config=False)
    o, o_port = supabase_project(root / "o", REF_C)
    n, n_port = supabase_project(root / "n", None)
    return {
        "search": Layout(b, {}, REF_A, a, a_port),
        "workdir-env": Layout(b, {"SUPABASE_WORKDIR": str(o)}, REF_C, o, o_port),
        "workdir-relative": Layout(b, {"SUPABASE_WORKDIR": "../../o"}, REF_C, o, o_port),
        "project-id-env": Layout(n, {"SUPABASE_PROJECT_ID": REF_B}, REF_B, n, n_port),
    }[case]


LINKED_CASES = ["search", "workdir-env", "workdir-relative", "project-id-env"]


def supabase_target(cwd: Path, env: dict[str, str], remote: list[str]) -> dict[str, Any]:
    """What the real Supabase CLI says it targets (its JSON answer carries it, also offline)."""
    out = subprocess.run([str(SUPABASE), "db", "query", "--output-format", "json", "--agent", "no",
                          "--read-only", *remote, "select 1"], cwd=cwd, capture_output=True,
                         text=True, timeout=HUNG, env={**os.environ, **OFFLINE, **env})
    answer = json.loads(out.stdout)
    return dict(answer.get("target") or answer["error"])


@pytest.mark.parametrize("case", LINKED_CASES)
def test_how_the_supabase_cli_finds_the_linked_project(case: str, tmp_path: Path) -> None:
    """The rule pgfence follows, as the Supabase CLI 3.1.0 applies it: the workdir is
    SUPABASE_WORKDIR (relative to the current directory, not searched), else the nearest folder
    upward with a supabase/config.toml; the project is SUPABASE_PROJECT_ID, else that folder's
    supabase/.temp/project-ref."""
    t = layout(tmp_path, case)
    assert supabase_target(t.cwd, t.env, ["--remote"])["project_ref"] == t.ref
    local = supabase_target(t.cwd, t.env, [])
    assert (local["kind"], local["port"]) == ("local", t.local_port)


def test_what_the_supabase_cli_makes_of_two_names_and_of_a_branch(tmp_path: Path) -> None:
    """Both names, when both are there, are not ambiguous to it: SUPABASE_PROJECT_ID wins. A
    name that is not 20 lowercase letters is a branch, which only its API resolves. (pgfence
    refuses both: test_a_target_that_cannot_be_resolved_is_refused.)"""
    layout(tmp_path, "search")
    both = supabase_target(tmp_path / "a", {"SUPABASE_PROJECT_ID": REF_B}, ["--remote"])
    assert both["project_ref"] == REF_B
    branch = supabase_target(tmp_path / "a", {}, ["--remote=my-branch"])
    assert "branch" in branch["message"]


@pytest.mark.parametrize("case", LINKED_CASES)
def test_the_confirmed_project_is_the_one_the_supabase_cli_gets(case: str,
                                                                 tmp_path: Path) -> None:
    t = layout(tmp_path, case)
    base, recorder, log = recording(tmp_path)
    out = run([*base, "--remote", "workers", "prepare-update", "mailer", "--confirm", t.ref],
              t.cwd, env={**OFFLINE, **t.env, **recorder})
    assert f"target: {t.ref}" in out.err, out.err
    assert out.code not in (0, 4), out.err     # confirmed; offline, the query itself fails
    assert out.out == ""
    calls = queries(recorded(log))
    assert calls, "no query reached the Supabase CLI"
    for call in calls:
        assert f"--remote={t.ref}" in call.argv and "--remote" not in call.argv, call.argv
        assert call.argv[call.argv.index("--workdir") + 1] == str(t.workdir), call.argv
        assert not {"SUPABASE_PROJECT_ID", "SUPABASE_WORKDIR"} & set(call.env)
        assert json.loads(call.stdout)["target"]["project_ref"] == t.ref   # what it used


@pytest.mark.parametrize("case", ["search", "workdir-env"])
def test_the_local_stack_is_the_workdirs(case: str, tmp_path: Path) -> None:
    t = layout(tmp_path, case)
    base, recorder, log = recording(tmp_path)
    out = run([*base, "--json", "status"], t.cwd, env={**OFFLINE, **t.env, **recorder})
    assert out.code == 3 and out.err == "", out.out + out.err   # no local stack runs there
    assert out.doc()["exit_code"] == 3
    calls = queries(recorded(log))
    assert calls
    for call in calls:
        assert not any(a.startswith("--remote") for a in call.argv), call.argv
        assert call.argv[call.argv.index("--workdir") + 1] == str(t.workdir), call.argv
        answer = json.loads(call.stdout)["target"]
        assert (answer["kind"], answer["port"]) == ("local", t.local_port)
    human = run([*base, "workers", "prepare-update", "mailer", "--confirm", "local"], t.cwd,
                env={**OFFLINE, **t.env, **recorder})
    shown = [line for line in human.err.splitlines() if line.startswith("target: local")]
    assert len(shown) == 1 and str(t.workdir) in shown[0], human.err


@pytest.mark.parametrize("case,remote,env,code,says", [
    ("branch", "--remote=my-branch", {}, 2, "branch"),
    ("ambiguous", "--remote", {"SUPABASE_PROJECT_ID": REF_B}, 2, "SUPABASE_PROJECT_ID"),
    ("bad-project-id", "--remote", {"SUPABASE_PROJECT_ID": "Not-A-Ref"}, 2, "SUPABASE_PROJECT_ID"),
    ("bad-link", "--remote", {}, 2, "project-ref"),
    ("not-linked", "--remote", {}, 3, "no linked project"),
])
def test_a_target_that_cannot_be_resolved_is_refused(case: str, remote: str,
                                                     env: dict[str, str], code: int, says: str,
                                                     tmp_path: Path) -> None:
    """Refused before the Supabase CLI runs any query, and never shown as a target."""
    supabase_project(tmp_path / "a", REF_A)
    supabase_project(tmp_path / "n", None)
    bad, _ = supabase_project(tmp_path / "bad", "not-a-ref")
    cwd = {"bad-link": bad, "not-linked": tmp_path / "n"}.get(case, tmp_path / "a")
    base, recorder, log = recording(tmp_path)
    env = {**OFFLINE, **env, **recorder}
    unresolved = remote.partition("=")[2] or "linked project"
    as_json = run([*base, remote, "--json", "workers", "prepare-update", "mailer", "--confirm",
                   unresolved], cwd, env=env)
    assert as_json.code == code and as_json.err == "", as_json.out + as_json.err
    assert as_json.doc()["exit_code"] == code and says in as_json.doc()["error"]
    human = run([*base, remote, "workers", "prepare-update", "mailer", "--confirm", unresolved],
                cwd, env=env)
    assert human.code == code and human.out == "" and says in human.err, human.err
    assert "target:" not in human.err
    assert queries(recorded(log)) == []


BYPASS = ["SUPABASE_YES", "SUPABASE_ASSUME_YES", "SUPABASE_YES_TO_ALL", "SUPABASE_CONFIRM",
          "SUPABASE_NO_CONFIRM", "CI_CONFIRM", "PGFENCE_CONFIRMED", "FORCE", "SUPABASE_FORCE",
          "DEPLOY_FORCE_YES", "supabase_yes", "Confirm"]


def test_confirmation_bypass_variables_never_reach_the_supabase_cli(db: Database,
                                                                     tmp_path: Path) -> None:
    before = seed(db)
    url, name = tcp_url(db)
    base, recorder, log = recording(tmp_path)
    env = {**{v: "1" for v in BYPASS}, "PGFENCE_TEST_MARKER": "passed on", **recorder}
    unconfirmed = run([*base, f"--remote={url}", "workers", "prepare-update", "mailer"],
                      tmp_path, env=env)
    assert unconfirmed.code == 4 and unconfirmed.out == "", unconfirmed.err
    assert enabled(db) == before and queries(recorded(log)) == []
    confirmed = run([*base, f"--remote={url}", "--json", "workers", "prepare-update", "mailer",
                     "--confirm", name], tmp_path, env=env)
    assert confirmed.code == 0 and confirmed.err == "", confirmed.out + confirmed.err
    assert confirmed.doc()["target"] == name
    calls = recorded(log)
    assert calls
    for call in calls:
        assert not set(BYPASS) & set(call.env), sorted(set(BYPASS) & set(call.env))
        # Negative control: what pgfence passes on does reach the recorder.
        assert call.env["PGFENCE_TEST_MARKER"] == "passed on"
    assert [c.argv.count("--yes") for c in queries(calls)] == [1, 0]   # the write, then status
