"""The CLI in a deploy script: `--version`, one `pgfence:` on errors, the target and --json after
the command too, --json errors with `sqlstate`, `target` and `exit_code`, durations in seconds and
the layers' work as JSON objects, `update-status --wait [--timeout]` (exit 0 drained, 5 gave up),
progress lines on a terminal only, a missing role named with its grant, an update window named
by its ref resolved to the command that finishes it, and the operator verbs (set-enabled,
deprecate, prune) behind the same confirmation. Whatever talks to a database runs through both
transports: a direct URL and the real Supabase CLI (tests/test_cli.py has the transports' own
rules). docs/cli.md's deploy script runs as written at the end."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgfence import __version__
from testkit.harness import HANG, Database
from tests.support import HUNG, ROOT, SUPABASE
from tests.test_cli import Target, enabled, run, seed, tcp_url


@pytest.fixture(params=["direct", "supabase"])
def target(request: pytest.FixtureRequest, db: Database) -> Target:
    url, name = tcp_url(db)
    if request.param == "direct":
        return Target(db, url, name, ["--db-url", url])
    return Target(db, url, name, ["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={url}"])


def as_role(t: Target, role: str) -> list[str]:
    """The target's arguments, connecting as another role."""
    url = t.url.replace("postgresql://postgres@", f"postgresql://{role}@")
    return ["--db-url", url] if t.args[0] == "--db-url" else [*t.args[:-1], f"--remote={url}"]


@dataclass
class Terminal:
    """The CLI with its stderr (and stdin) on a terminal, as an operator runs it."""

    proc: subprocess.Popen[str]
    master: int
    seen: bytes = b""

    def until(self, text: bytes) -> None:
        while text not in self.seen:
            ready, _, _ = select.select([self.master], [], [], HANG)
            assert ready, f"never printed {text!r}; saw {self.seen!r}"
            try:
                chunk = os.read(self.master, 4096)
            except OSError:          # the other end closed: the process ended
                chunk = b""
            assert chunk, f"ended without printing {text!r}; saw {self.seen!r}"
            self.seen += chunk

    def finish(self) -> tuple[int, str, str]:
        out, _ = self.proc.communicate(timeout=HUNG)
        while True:
            ready, _, _ = select.select([self.master], [], [], 0)
            try:
                chunk = os.read(self.master, 4096) if ready else b""
            except OSError:
                chunk = b""
            if not chunk:
                break
            self.seen += chunk
        os.close(self.master)
        return self.proc.returncode, out, self.seen.decode()


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def on_terminal(started: list[Terminal], args: list[str], cwd: Path) -> Terminal:
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pgfence.cli", *args], cwd=cwd, stdin=slave,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    started.append(Terminal(proc, master))
    return started[-1]


# --------------------------------------------------------------------------------------------
# The command line


def test_version_and_one_prefix_on_usage_errors(tmp_path: Path) -> None:
    version = run(["--version"], tmp_path)
    assert (version.code, version.out) == (0, f"pgfence {__version__}\n")
    missing = run(["workers", "prepare-update"], tmp_path)
    assert missing.code == 2 and missing.out == ""
    (error,) = [line for line in missing.err.splitlines() if "required" in line]
    assert error == ("pgfence: workers prepare-update: the following arguments are required: "
                     "RESOURCE")
    assert missing.err.count("pgfence:") == 1, missing.err
    as_json = run(["--json", "workers", "prepare-update"], tmp_path)
    assert as_json.code == 2 and as_json.err == "", as_json.err
    assert as_json.doc() == {"error": "workers prepare-update: the following arguments are "
                                      "required: RESOURCE", "sqlstate": None, "target": None,
                             "exit_code": 2}


def test_target_and_json_after_the_command(target: Target, tmp_path: Path) -> None:
    seed(target.db)
    after = run(["status", *target.args, "--json"], tmp_path)
    assert after.code == 0 and after.err == "", after.err
    assert after.doc()["target"] == target.name
    name = target.name
    prep = run(["workers", "prepare-update", "mailer", *target.args, "--confirm", name, "--json"],
               tmp_path)
    assert prep.code == 0, prep.out + prep.err
    assert enabled(target.db)["mailer"] is False
    twice = run(["--db-url", "postgresql://a@127.0.0.1:1/x", "status", "--db-url",
                 "postgresql://b@127.0.0.1:1/y"], tmp_path)
    assert twice.code == 2 and "--db-url is given twice" in twice.err
    both = run(["--db-url", target.url, "status", "--supabase"], tmp_path)
    assert both.code == 2 and "not allowed with argument --db-url" in both.err


# --------------------------------------------------------------------------------------------
# --json for scripts


def test_json_errors_carry_sqlstate_target_and_exit_code(target: Target, tmp_path: Path) -> None:
    seed(target.db)
    unknown = str(uuid.uuid4())
    out = run([*target.args, "--json", "workers", "update-status", unknown], tmp_path)
    assert out.code == 1 and out.err == "", out.err
    doc = out.doc()
    assert doc["exit_code"] == 1 and doc["target"] == target.name
    assert "does not exist" in doc["error"]
    # The Supabase CLI 3.1.0 passes on the server's message without its SQLSTATE.
    assert doc["sqlstate"] == ("PF005" if target.args[0] == "--db-url" else None)
    unconfirmed = run([*target.args, "--json", "workers", "set-enabled", "mailer", "false"],
                      tmp_path)
    assert unconfirmed.code == 4 and unconfirmed.doc()["target"] == target.name
    assert enabled(target.db)["mailer"] is True


def test_durations_are_seconds_and_layer_work_is_json(target: Target, tmp_path: Path) -> None:
    seed(target.db)
    target.db.sql("select pgfence.acquire('mailer', 'w', '1 hour')")
    doc = run([*target.args, "--json", "status"], tmp_path).doc()
    mailer = next(r for r in doc["resources"] if r["resource"] == "mailer")
    assert isinstance(mailer["time_left"], float) and 3000 < mailer["time_left"] <= 3600
    counters = next(r for r in doc["counters"] if r["resource"] == "mailer")
    assert isinstance(counters["lease_age"], float) and 0 <= counters["lease_age"] < 600
    token = target.db.one("select pgfence.prepare_update(array['mailer'], gen_random_uuid())")
    status = run([*target.args, "--json", "workers", "update-status", str(token)], tmp_path)
    (row,) = status.doc()["status"]
    assert row["in_flight"] == {"tasks": 0} and row["unfenced_writes"] == []
    human = run([*target.args, "workers", "update-status", str(token)], tmp_path)
    assert '{"tasks": 0}' in human.out


# --------------------------------------------------------------------------------------------
# --wait


def draining_window(db: Database) -> tuple[uuid.UUID, uuid.UUID]:
    """A window over mailer whose lease is still held (draining): (token, lease id)."""
    seed(db)
    lease = db.one("select lease_id from pgfence.acquire('mailer', 'w', '1 hour')")
    token = db.one("select pgfence.prepare_update(array['mailer', 'billing'], "
                   "gen_random_uuid())")
    return token, lease


def test_wait_returns_once_drained_with_progress_on_the_terminal(
        target: Target, tmp_path: Path, terminal: list[Terminal]) -> None:
    token, lease = draining_window(target.db)
    waiting = on_terminal(terminal, [*target.args, "workers", "update-status", str(token),
                                     "--wait"], tmp_path)
    # It looked, found mailer draining, and keeps waiting: the lease is held for an hour.
    waiting.until(b"1 of 2 drained; mailer draining")
    assert waiting.proc.poll() is None
    target.db.sql("select pgfence.release(%s)", (lease,))
    code, out, err = waiting.finish()
    assert code == 0, out + err
    assert re.findall(r"\b(drained|draining|unknown)\b", out) == ["drained", "drained"], out
    assert err.endswith("\r\x1b[K"), repr(err[-40:])       # the progress line is erased
    if target.args[0] == "--supabase":
        assert "waiting for the Supabase CLI" in err


def test_wait_without_a_terminal_prints_no_progress(target: Target, tmp_path: Path) -> None:
    token, lease = draining_window(target.db)
    target.db.sql("select pgfence.release(%s)", (lease,))
    out = run([*target.args, "--json", "workers", "update-status", str(token), "--wait"],
              tmp_path)
    assert out.code == 0 and out.err == "", out.err
    doc = out.doc()
    assert [r["verdict"] for r in doc["status"]] == ["drained", "drained"]
    assert isinstance(doc["waited_seconds"], float)
    human = run([*target.args, "workers", "update-status", str(token), "--wait"], tmp_path)
    assert human.code == 0 and human.err == "", human.err


def test_wait_gives_up_at_its_timeout_with_exit_5(target: Target, tmp_path: Path) -> None:
    """The lease is held for an hour: a timeout of a second ends the wait, not the window."""
    token, _ = draining_window(target.db)
    out = run([*target.args, "--json", "workers", "update-status", str(token), "--wait",
               "--timeout", "1s"], tmp_path)
    assert out.code == 5 and out.err == "", out.out + out.err
    doc = out.doc()
    assert doc["exit_code"] == 5 and doc["target"] == target.name and doc["sqlstate"] is None
    assert "gave up waiting" in doc["error"] and "not drained: mailer draining" in doc["error"]
    assert [r["verdict"] for r in doc["status"]] == ["drained", "draining"]
    assert enabled(target.db) == {"mailer": False, "billing": False}   # the window stays open
    human = run([*target.args, "workers", "update-status", str(token), "--wait", "--timeout",
                 "0"], tmp_path)
    assert human.code == 5 and f"update-status {token} --wait" in human.err


def test_wait_on_a_finished_window_is_refused(target: Target, tmp_path: Path) -> None:
    token, _ = draining_window(target.db)
    target.db.sql("select pgfence.finish_update(%s)", (token,))
    out = run([*target.args, "workers", "update-status", str(token), "--wait"], tmp_path)
    assert out.code == 1 and "is finished: there is nothing to wait for" in out.err
    assert run([*target.args, "workers", "update-status", str(token), "--timeout", "5"],
               tmp_path).code == 2


def test_each_supabase_call_shows_a_progress_line_on_a_terminal(
        db: Database, tmp_path: Path, terminal: list[Terminal]) -> None:
    seed(db)
    url, _ = tcp_url(db)
    base = ["--supabase", "--supabase-bin", str(SUPABASE), f"--remote={url}"]
    code, out, err = on_terminal(terminal, [*base, "status"], tmp_path).finish()
    assert code == 0 and "mailer" in out, err
    assert "pgfence: waiting for the Supabase CLI (0 s)" in err
    assert err.endswith("\r\x1b[K"), repr(err)
    # Negative control: the direct transport answers at once and says nothing.
    code, out, err = on_terminal(terminal, ["--db-url", url, "status"], tmp_path).finish()
    assert code == 0 and err == "", repr(err)


# --------------------------------------------------------------------------------------------
# Refusals the operator can act on


@pytest.fixture
def bare_role(db: Database) -> Iterator[str]:
    role = f"pgfence_bare_{uuid.uuid4().hex[:8]}"
    db.sql(f"create role {role} login")
    yield role
    db.sql(f"drop owned by {role}")
    db.sql(f"drop role {role}")


def test_a_missing_role_is_named_with_its_grant(target: Target, bare_role: str,
                                                tmp_path: Path) -> None:
    before = seed(target.db)
    name = target.name
    me = as_role(target, bare_role)
    read = run([*me, "--json", "status"], tmp_path)
    assert read.code == 1, read.out
    doc = read.doc()
    assert doc["sqlstate"] == "42501" and doc["target"] == name
    assert f"grant pgfence_monitor to {bare_role};" in doc["error"]
    assert "As postgres (the owner of schema pgfence)" in doc["error"]
    target.db.sql(f"grant pgfence_monitor to {bare_role}")
    assert run([*me, "status"], tmp_path).code == 0
    write = run([*me, "workers", "set-enabled", "mailer", "false", "--confirm", name], tmp_path)
    assert write.code == 1
    assert "needs pgfence_operator" in write.err
    assert f"run: grant pgfence_operator to {bare_role};" in write.err
    assert enabled(target.db) == before
    # Negative control: with the role, a refusal about something else is not called a
    # missing role.
    target.db.sql(f"grant pgfence_operator to {bare_role}")
    other = run([*me, "--json", "workers", "set-enabled", "nobody", "false", "--confirm", name],
                tmp_path)
    assert other.code == 1 and "not registered" in other.doc()["error"]
    assert "grant" not in other.doc()["error"]
    assert other.doc()["sqlstate"] == ("PF002" if target.args[0] == "--db-url" else None)


def test_an_open_window_is_named_by_the_command_that_finishes_it(target: Target,
                                                                 tmp_path: Path) -> None:
    seed(target.db)
    name = target.name
    first = run([*target.args, "--json", "workers", "prepare-update", "mailer", "--confirm",
                 name], tmp_path).doc()["token"]
    overlap = run([*target.args, "workers", "prepare-update", "billing", "mailer", "--confirm",
                   name], tmp_path)
    assert overlap.code == 1
    (line,) = [x for x in overlap.err.splitlines() if x.startswith("pgfence: the database")]
    assert "resources already in an open update: mailer (update ref" in line
    assert f"is the open window {first} over mailer" in line
    shown = re.sub(r"--supabase-bin \S+", "--supabase-bin SUPABASE", line)
    assert shown.endswith(f"finish it with pgfence {placeholder(target)} workers finish-update "
                          f"{first} --confirm {name}"), line
    assert "pgfence.finish_update" not in line             # the SQL hint gave way to the CLI's
    # The command it prints is the one that works.
    done = run([*target.args, "workers", "finish-update", first, "--confirm", name], tmp_path)
    assert done.code == 0 and "restored" in done.out
    # Unknown token: where the open windows are listed, with their tokens.
    gone = run([*target.args, "workers", "finish-update", str(uuid.uuid4()), "--confirm", name],
               tmp_path)
    assert gone.code == 1 and "does not exist" in gone.err
    assert "status` lists the open windows with their tokens" in gone.err
    second = target.db.one("select pgfence.prepare_update(array['billing'], gen_random_uuid())")
    status = run([*target.args, "--json", "status"], tmp_path).doc()
    (window,) = status["open_updates"]
    assert window["token"] == str(second)
    assert window["ref"] == target.db.one("select pgfence.ref(%s)", (second,))


def placeholder(t: Target) -> str:
    return ('--db-url "$DATABASE_URL"' if t.args[0] == "--db-url"
            else '--supabase --remote="$DATABASE_URL" --supabase-bin SUPABASE')


# --------------------------------------------------------------------------------------------
# The operator verbs


def test_set_enabled_and_deprecate(target: Target, tmp_path: Path) -> None:
    seed(target.db)
    name = target.name
    assert run([*target.args, "workers", "set-enabled", "mailer", "false"], tmp_path).code == 4
    assert run([*target.args, "workers", "deprecate", "mailer", "--confirm", "elsewhere"],
               tmp_path).code == 4
    off = run([*target.args, "--json", "workers", "set-enabled", "mailer", "false",
               "--confirm", name], tmp_path)
    assert off.code == 0, off.out + off.err
    assert {k: off.doc()[k] for k in ("resource", "enabled", "previous")} == {
        "resource": "mailer", "enabled": False, "previous": True}
    assert enabled(target.db)["mailer"] is False
    on = run([*target.args, "workers", "set-enabled", "mailer", "true", "--confirm", name],
             tmp_path)
    assert on.code == 0 and "mailer: enabled true (it was false)" in on.out
    lease = target.db.one("select lease_id from pgfence.acquire('mailer', 'w', '1 hour')")
    drained = run([*target.args, "--json", "workers", "deprecate", "mailer", "--confirm", name],
                  tmp_path)
    assert drained.code == 0, drained.out + drained.err
    assert drained.doc()["drained"] is True
    assert drained.doc()["lease_ref"] == target.db.one("select pgfence.ref(%s)", (lease,))
    assert str(lease) not in drained.out                   # a capability: its ref only
    assert target.db.one("select state from pgfence.leases") == "draining"
    again = run([*target.args, "workers", "deprecate", "mailer", "--confirm", name], tmp_path)
    assert again.code == 0 and "had no active lease: nothing to drain" in again.out
    bad = run([*target.args, "workers", "set-enabled", "mailer", "yes", "--confirm", name],
              tmp_path)
    assert bad.code == 2 and enabled(target.db)["mailer"] is True


def test_prune(target: Target, tmp_path: Path) -> None:
    seed(target.db)
    lease = target.db.one("select lease_id from pgfence.acquire('mailer', 'w', '1 hour')")
    target.db.sql("select pgfence.release(%s)", (lease,))
    target.db.sql("update pgfence.leases set ended_at = now() - interval '3 hours'")
    name = target.name
    assert run([*target.args, "prune", "--older-than", "2h"], tmp_path).code == 4
    assert target.db.one("select count(*) from pgfence.leases") == 1
    out = run([*target.args, "--json", "prune", "--older-than", "2h", "--confirm", name],
              tmp_path)
    assert out.code == 0, out.out + out.err
    assert out.doc()["older_than_seconds"] == 7200
    assert {r["what"]: r["rows"] for r in out.doc()["removed"]}["leases"] == 1
    assert target.db.one("select count(*) from pgfence.leases") == 0
    short = run([*target.args, "prune", "--older-than", "2m", "--confirm", name], tmp_path)
    assert short.code == 1 and "older_than" in short.err        # prune's own bound: 1 hour
    assert run([*target.args, "prune", "--older-than", "soon", "--confirm", name],
               tmp_path).code == 2


# --------------------------------------------------------------------------------------------
# The deploy script of docs/cli.md, as written


def deploy_script() -> str:
    text = (ROOT / "docs/cli.md").read_text()
    match = re.search(r"<!-- deploy script: [^>]*-->\s*```bash\n(.*?)```", text, re.S)
    assert match, "docs/cli.md has no deploy script"
    return match.group(1)


def run_deploy_script(db: Database, tmp_path: Path, script: str,
                      deploy: list[str]) -> subprocess.CompletedProcess[str]:
    """The script with pgfence on PATH (this package), DATABASE_URL, TARGET and RESOURCES set,
    and ``deploy`` as the deploy command it is given."""
    url, name = tcp_url(db)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pgfence").write_text(f'#!/bin/sh\nexec {sys.executable} -m pgfence.cli "$@"\n')
    (bin_dir / "pgfence").chmod(0o755)
    (tmp_path / "deploy.sh").write_text(script)
    return subprocess.run(["bash", str(tmp_path / "deploy.sh"), *deploy], cwd=tmp_path,
                          capture_output=True, text=True, timeout=HUNG,
                          env={**os.environ, "DATABASE_URL": url, "TARGET": name,
                               "RESOURCES": "mailer billing",
                               "PATH": f"{bin_dir}:{os.environ['PATH']}"})


def test_the_deploy_script_runs_as_written(db: Database, tmp_path: Path) -> None:
    """The deploy step records what it saw: it ran inside the window, resources paused."""
    before = seed(db)
    lease = db.one("select lease_id from pgfence.acquire('mailer', 'w', '1 hour')")
    db.sql("create table deployed (resource text, enabled boolean)")
    # The worker holding mailer's lease finishes and lets go (before the wait: the wait's own
    # test watches one that has to wait).
    db.sql("select pgfence.release(%s)", (lease,))
    deploy = ["psql", "-X", "-qAt", "-d", tcp_url(db)[0], "-c",
              "insert into deployed select resource, enabled from pgfence.resources"]
    out = run_deploy_script(db, tmp_path, deploy_script(), deploy)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(db.sql("select resource, enabled from deployed")) == [
        ("billing", False), ("mailer", False)]                  # deployed inside the window
    assert enabled(db) == before                                # and restored after
    assert db.one("select count(*) from pgfence.open_updates") == 0
    assert "mailer: restored" in out.stdout and "billing: kept_disabled" in out.stdout
    print(out.stdout, out.stderr)


def test_negative_control_the_deploy_script_stops_when_the_wait_gives_up(
        db: Database, tmp_path: Path) -> None:
    """A lease that never lets go and a short timeout: the wait's exit 5 stops the script
    before the deploy, and the window stays open for the operator, who is told its token."""
    seed(db)
    db.sql("select pgfence.acquire('mailer', 'w', '1 hour')")
    script = deploy_script()
    assert "--timeout 30m" in script
    out = run_deploy_script(db, tmp_path, script.replace("--timeout 30m", "--timeout 1s"),
                            ["touch", str(tmp_path / "deployed")])
    assert out.returncode == 5, out.stdout + out.stderr
    assert not (tmp_path / "deployed").exists()
    token = db.one("select token::text from pgfence.open_updates")
    assert f"workers update-status {token} --wait" in out.stderr


def test_json_documents_parse(tmp_path: Path) -> None:
    """Every --json error is one document (the usage error before any target, too)."""
    for args in (["--json", "status"], ["--json", "bogus"], ["prune", "--json"]):
        out = run(args, tmp_path)
        assert out.err == "", (args, out.err)
        assert json.loads(out.out)["exit_code"] == 2
