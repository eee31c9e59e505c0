"""`pgfence init` on files alone (no database): what it writes, in which order and with which
names; idempotence; that it never overwrites a file it did not write nor one of its own that
was changed; --dry-run; the refusals (bad DIR, no supabase/, unknown layer, anon). The
migrations it writes are applied to real databases in tests/test_quickstart.py."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path

import pytest

from pgfence import cli, init
from pgfence.releases import Files
from testkit import layers
from tests.support import ROOT

NOW = dt.datetime(2026, 12, 2, 7, 30, 0, tzinfo=dt.UTC)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "supabase/migrations").mkdir(parents=True)
    (tmp_path / "supabase/migrations/20250101000000_app.sql").write_text("create table t ();\n")
    return tmp_path


def written(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*"))
            if p.is_file()}


def test_supabase_layout_in_order_after_the_last_migration(project: Path) -> None:
    (project / "supabase/migrations/20991231235959_future.sql").write_text("select 1;\n")
    doc = init.Project(project, supabase=True, layers=["pgmq", "pgflow"], role="service_role",
                       cron=True, now=NOW).run(dry_run=False)
    assert [f["path"] for f in doc["files"]] == [
        "supabase/migrations/21000101000000_pgfence.sql",   # after 2099-12-31 23:59:59
        "supabase/migrations/21000101000001_pgfence_pgmq.sql",
        "supabase/migrations/21000101000002_pgfence_pgflow.sql",
        "supabase/migrations/21000101000003_pgfence_grants.sql",
        "supabase/migrations/21000101000004_pgfence_cron.sql",
        "supabase/functions/_shared/pgfence/mod.ts",
        "supabase/functions/_shared/pgfence/pgflow.ts",
        "supabase/functions/pgfence-worker/index.ts"]
    files = written(project)
    core = files["supabase/migrations/21000101000000_pgfence.sql"]
    assert core.endswith((ROOT / "sql/pgfence.sql").read_text())
    assert files["supabase/migrations/21000101000001_pgfence_pgmq.sql"].endswith(
        (ROOT / "sql/pgfence-pgmq.sql").read_text())
    grants = files["supabase/migrations/21000101000003_pgfence_grants.sql"]
    assert "grant pgfence_worker to service_role;" in grants
    worker = files["supabase/functions/pgfence-worker/index.ts"]
    assert 'from "../_shared/pgfence/mod.ts";' in worker and "request_start" in worker
    mod = files["supabase/functions/_shared/pgfence/mod.ts"]
    assert 'from "npm:postgres@3.4.9";' in mod and 'from "postgres";' not in mod
    manifest = json.loads(files["supabase/pgfence-init.json"])
    assert set(manifest["files"]) == {"migration:core", "migration:pgmq", "migration:pgflow",
                                      "migration:grants", "migration:cron", "deno:mod.ts",
                                      "deno:pgflow.ts", "worker"}


def test_dated_now_when_the_last_migration_is_older(project: Path) -> None:
    plan = init.Project(project, supabase=True, layers=[], role="service_role", cron=False,
                        now=NOW).plan()
    assert [p.path for p in plan if p.migration] == [
        "supabase/migrations/20261202073000_pgfence.sql",
        "supabase/migrations/20261202073001_pgfence_grants.sql"]


def test_a_second_run_writes_nothing_and_says_so(project: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "init", "--supabase", str(project))[0] == 0
    before = {p: (project / p).stat().st_mtime_ns for p in written(project)}
    code, out, _ = run(capsys, "init", "--supabase", str(project))
    assert code == 0
    assert "nothing to write: every file is as pgfence init wrote it" in out
    assert "  wrote " not in out and out.count("  unchanged  ") == 5
    assert {p: (project / p).stat().st_mtime_ns for p in written(project)} == before


def test_a_layer_added_later_is_a_new_migration_after_the_others(project: Path) -> None:
    first = init.Project(project, supabase=True, layers=[], role="service_role", cron=True,
                         now=NOW).run(dry_run=False)
    later = init.Project(project, supabase=True, layers=["pgmq"], role="service_role", cron=True,
                         now=NOW).run(dry_run=False)
    actions = {f["path"]: f["action"] for f in later["files"]}
    assert [p for p, a in actions.items() if a == "write"] == [
        "supabase/migrations/20261202073003_pgfence_pgmq.sql"]
    assert all(actions[f["path"]] == "keep" for f in first["files"])


def test_never_overwrites_a_file_it_did_not_write(project: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    theirs = project / "supabase/functions/pgfence-worker/index.ts"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("// the user's own function\n")
    code, _, err = run(capsys, "init", "--supabase", str(project))
    assert code == cli.EXIT_REFUSED
    assert ("nothing was written: supabase/functions/pgfence-worker/index.ts there already, "
            "not written by init") in err
    assert theirs.read_text() == "// the user's own function\n"
    assert written(project).keys() == {"supabase/migrations/20250101000000_app.sql",
                                       "supabase/functions/pgfence-worker/index.ts"}


@pytest.mark.parametrize("how", ["by hand", "manifest gone"])
def test_a_project_that_installs_pgfence_already_is_refused(
        project: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    migrations = project / "supabase/migrations"
    if how == "by hand":   # docs/supabase.md's steps before init
        shutil.copy(ROOT / "sql/pgfence.sql", migrations / "20261129000000_pgfence.sql")
        there = "supabase/migrations/20261129000000_pgfence.sql"
    else:
        assert run(capsys, "init", "--supabase", str(project))[0] == 0
        (project / "supabase/pgfence-init.json").unlink()
        there = str(sorted(migrations.glob("*_pgfence.sql"))[0].relative_to(project))
    before = written(project)
    code, _, err = run(capsys, "init", "--supabase", str(project))
    assert code == cli.EXIT_REFUSED
    assert f"nothing was written: {there}" in err and "already install" in err
    assert written(project) == before


def test_a_changed_file_of_ours_is_refused_not_clobbered(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "init", "--supabase", str(project))[0] == 0
    (grants,) = (project / "supabase/migrations").glob("*_pgfence_grants.sql")
    grants.write_text(grants.read_text() + "grant pgfence_worker to anon;\n")
    code, _, err = run(capsys, "init", "--supabase", str(project))
    assert code == cli.EXIT_REFUSED and "changed since init wrote it" in err
    code, out, _ = run(capsys, "init", "--supabase", str(project), "--json")
    doc = json.loads(out)
    assert code == cli.EXIT_REFUSED and doc["exit_code"] == cli.EXIT_REFUSED
    assert f"{grants.relative_to(project)} changed since init wrote it" in doc["error"]
    assert grants.read_text().endswith("to anon;\n")


def test_an_unchanged_client_file_of_ours_is_updated_a_migration_never(project: Path) -> None:
    init.Project(project, supabase=True, layers=[], role="service_role", cron=True,
                 now=NOW).run(dry_run=False)
    # As if an older package had written them: the manifest agrees with the files on disk.
    manifest_path = project / "supabase/pgfence-init.json"
    manifest = json.loads(manifest_path.read_text())
    for key in ("deno:mod.ts", "migration:cron"):
        f = project / manifest["files"][key]["path"]
        f.write_text("// older\n")
        manifest["files"][key]["sha256"] = init.sha("// older\n")
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(init.InitError, match="a migration is never rewritten"):
        init.Project(project, supabase=True, layers=[], role="service_role", cron=True,
                     now=NOW).run(dry_run=False)
    doc = init.Project(project, supabase=True, layers=[], role="service_role", cron=False,
                       now=NOW).run(dry_run=False)
    assert {f["path"]: f["action"] for f in doc["files"]}[
        "supabase/functions/_shared/pgfence/mod.ts"] == "update"
    assert (project / "supabase/functions/_shared/pgfence/mod.ts").read_text() != "// older\n"


def test_dry_run_lists_the_files_and_writes_nothing(project: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    before = written(project)
    code, out, _ = run(capsys, "init", "--supabase", str(project), "--layers", "pgmq,pgflow",
                       "--dry-run")
    assert code == 0 and written(project) == before
    listed = re.findall(r"^  would write +(\S+)$", out, re.M)
    assert [re.sub(r"\d{14}", "T", p) for p in listed] == [
        "supabase/migrations/T_pgfence.sql", "supabase/migrations/T_pgfence_pgmq.sql",
        "supabase/migrations/T_pgfence_pgflow.sql", "supabase/migrations/T_pgfence_grants.sql",
        "supabase/migrations/T_pgfence_cron.sql", "supabase/functions/_shared/pgfence/mod.ts",
        "supabase/functions/_shared/pgfence/pgflow.ts",
        "supabase/functions/pgfence-worker/index.ts"]
    assert out.rstrip().endswith("dry run: 8 files, nothing was written")


def test_plain_layout_without_a_role_has_no_grants(tmp_path: Path) -> None:
    plan = init.Project(tmp_path, supabase=False, layers=[], role=None, cron=True).plan()
    assert [p.path for p in plan if p.migration] == ["pgfence/migrations/0001_pgfence.sql",
                                                      "pgfence/migrations/0002_pgfence_cron.sql"]


def test_plain_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "init", "--plain", str(tmp_path), "--no-cron", "--role", "App")
    assert code == 0, out
    files = written(tmp_path)
    assert sorted(files) == ["pgfence/deno/mod.ts", "pgfence/deno/worker.ts",
                             "pgfence/migrations/0001_pgfence.sql",
                             "pgfence/migrations/0002_pgfence_grants.sql",
                             "pgfence/pgfence-init.json"]
    assert 'grant pgfence_worker to "App";' in files["pgfence/migrations/0002_pgfence_grants.sql"]
    assert 'from "./mod.ts";' in files["pgfence/deno/worker.ts"]


@pytest.mark.parametrize(("argv", "code", "said"), [
    (["init", "--supabase", "/nonexistent/pgfence"], cli.EXIT_USAGE, "no such directory"),
    (["init", "--supabase", "{tmp}"], cli.EXIT_USAGE, "has no supabase/ folder"),
    (["init", "--plain", "{tmp}", "--layers", "pgmq,kafka"], cli.EXIT_USAGE,
     f"unknown layer kafka (known: {', '.join(init.LAYERS)})"),
    (["init", "--plain", "{tmp}", "--layers", "pgflow"], cli.EXIT_USAGE,
     "--layers pgflow needs the pgmq layer"),
    (["init", "--plain", "{tmp}", "--role", "anon"], cli.EXIT_USAGE, "never grant pgfence to anon"),
    (["init", "{tmp}"], cli.EXIT_USAGE, "one of the arguments --supabase --plain is required"),
    (["--db-url", "postgresql:///x", "init", "--plain", "{tmp}"], cli.EXIT_USAGE,
     "init connects to no database"),
])
def test_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int,
                  said: str) -> None:
    got, out, err = run(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert got == code and said in err, out + err
    assert not list(tmp_path.iterdir())


def schema_copy(tmp_path: Path, prune: bool) -> Files:
    root = tmp_path / ("with" if prune else "without")
    shutil.copytree(ROOT / "sql", root)
    bundle = (root / "pgfence.sql").read_text()
    bundle = re.sub(r"create (or replace )?function pgfence\.prune\(", "-- ", bundle)
    if prune:
        bundle += "\ncreate function pgfence.prune(older_than interval default '7 days')\n"
    (root / "pgfence.sql").write_text(bundle)
    return Files(root)


@pytest.mark.parametrize("prune", [True, False])
def test_the_prune_job_only_when_the_schema_has_prune(tmp_path: Path, prune: bool) -> None:
    (tmp_path / "p/supabase").mkdir(parents=True)
    project = init.Project(tmp_path / "p", supabase=True, layers=[], role="service_role",
                           cron=True, files=schema_copy(tmp_path, prune), now=NOW)
    (cron,) = [p.text for p in project.plan() if p.key == "migration:cron"]
    assert "select cron.schedule('pgfence-requeue-expired'," in cron
    assert "'select pgfence.requeue_expired()');" in cron
    assert ("select cron.schedule('pgfence-prune'" in cron) is prune


@pytest.mark.parametrize("doc", ["docs/cli.md", "docs/supabase.md"])
def test_the_documented_dry_run_listing_is_what_init_prints(
        doc: str, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = "pgfence init --supabase --layers pgmq,pgflow --dry-run"
    block = re.search(rf"```console\n\$ {re.escape(command)}\n(.*?)```",
                      (ROOT / doc).read_text(), re.S)
    assert block, f"{doc} shows no {command!r}"
    code, out, _ = run(capsys, *command.split()[1:], str(project))
    assert code == 0
    stamp = re.compile(r"\d{14}")
    assert stamp.sub("T", out.replace(f"project {project} ", "project . ")) == stamp.sub(
        "T", block.group(1))


def test_inits_layers_are_the_repositorys() -> None:
    # The wheel ships no manifest: init's own list is the manifests' (testkit.layers), in the
    # same install order and with the same needs, and refuses a layer without what it needs.
    assert [(name, layer.needs) for name, layer in init.LAYERS.items()] == [
        (layer.name, layer.needs) for layer in layers.discover()]
    for layer in layers.discover():
        assert init.parse_layers(",".join([*layer.needs, layer.name])) == [*layer.needs, layer.name]
        for need in layer.needs:
            with pytest.raises(init.InitError, match=f"needs the {need} layer"):
                init.parse_layers(",".join(n for n in [*layer.needs, layer.name] if n != need))


def test_negative_control_a_layer_init_does_not_know_is_seen(tmp_path: Path) -> None:
    # A new folder with a manifest is a new layer, for the repository at once, and the tie
    # above fails until init knows it too.
    shutil.copytree(ROOT / "layers", tmp_path / "layers")
    (tmp_path / "layers/jobs").mkdir()
    (tmp_path / "layers/jobs/layer.toml").write_text(
        'name = "jobs"\nschema = "pgfence_jobs"\nneeds = ["pgmq"]\n')
    found = [(layer.name, layer.needs) for layer in layers.discover(tmp_path)]
    assert ("jobs", ("pgmq",)) in found
    assert [(name, layer.needs) for name, layer in init.LAYERS.items()] != found
