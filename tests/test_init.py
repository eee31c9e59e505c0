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
from pgfence.releases import key as release_key
from testkit import layers
from tests.support import ROOT, package_of

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
        "supabase/functions/pgfence-worker/index.ts",
        "supabase/functions/pgfence-flow-worker/index.ts",
        "supabase/functions/pgfence-flow-worker/deno.json"]
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
                                      "deno:pgflow.ts", "worker", "flow-worker",
                                      "flow-worker:deno.json"}
    # The pgflow worker: FlowWorker.serve, its imports through its own deno.json.
    flow_worker = files["supabase/functions/pgfence-flow-worker/index.ts"]
    assert 'from "pgfence/pgflow";' in flow_worker and "FlowWorker.serve(" in flow_worker
    imports = json.loads(files["supabase/functions/pgfence-flow-worker/deno.json"]
                         .split("\n", 1)[1])["imports"]
    assert imports["pgfence/pgflow"] == "../_shared/pgfence/pgflow.ts"
    assert imports["pgfence"] == "../_shared/pgfence/mod.ts"
    assert imports["@pgflow/dsl"].startswith("npm:@pgflow/dsl@")


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
        "supabase/functions/pgfence-worker/index.ts",
        "supabase/functions/pgfence-flow-worker/index.ts",
        "supabase/functions/pgfence-flow-worker/deno.json"]
    assert out.rstrip().endswith("dry run: 10 files, nothing was written")


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
    (["init", "--plain", "{tmp}", "--supervise", "emails"], cli.EXIT_USAGE,
     "--supervise writes a pg_cron job"),
    (["init", "--plain", "{tmp}", "--supervise", "a b"], cli.EXIT_USAGE,
     "--supervise writes a pg_cron job"),
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


# --------------------------------------------------------------------------------------------
# Nothing outside the project (issue 43, item 3)


def outside_and_inside(tmp_path: Path) -> tuple[Path, Path]:
    """A project and a folder beside it, which init must never write into."""
    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / "supabase/migrations").mkdir(parents=True)
    outside.mkdir()
    return project, outside


@pytest.mark.parametrize("link", ["dangling file", "file", "folder"])
def test_a_symlink_in_the_way_is_refused(tmp_path: Path, link: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    project, outside = outside_and_inside(tmp_path)
    if link == "folder":
        (project / "supabase/functions").symlink_to(outside)
        there = "supabase/functions"
    else:
        (project / "supabase/functions/pgfence-worker").mkdir(parents=True)
        if link == "file":
            (outside / "x.ts").write_text("theirs\n")
        (project / "supabase/functions/pgfence-worker/index.ts").symlink_to(outside / "x.ts")
        there = "supabase/functions/pgfence-worker/index.ts"
    before = written(project)
    code, _, err = run(capsys, "init", "--supabase", str(project))
    assert code == cli.EXIT_REFUSED, err
    assert f"{there} is a symlink" in err and "nothing was written" in err
    assert written(outside) == ({"x.ts": "theirs\n"} if link == "file" else {})
    assert written(project) == before


@pytest.mark.parametrize("path", ["../outside/x.sql", "/tmp/pgfence-init-escape.sql",
                                  "supabase/migrations/../../../outside/x.sql",
                                  "supabase/config.toml",
                                  "supabase/migrations/20990101000000_other.sql"])
def test_a_manifest_path_init_would_not_choose_is_refused(
        tmp_path: Path, path: str, capsys: pytest.CaptureFixture[str]) -> None:
    project, outside = outside_and_inside(tmp_path)
    (project / "supabase/pgfence-init.json").write_text(json.dumps(
        {"pgfence": "0.2.1", "files": {"migration:core": {"path": path, "sha256": "0" * 64}}}))
    before = written(project)
    code, _, err = run(capsys, "init", "--supabase", str(project))
    assert code == cli.EXIT_REFUSED, err
    assert f"records '{path}' for migration:core, a path pgfence init never writes" in err
    assert written(outside) == {} and not Path("/tmp/pgfence-init-escape.sql").exists()
    assert written(project) == before


def test_a_symlinked_manifest_is_refused(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    project, outside = outside_and_inside(tmp_path)
    (outside / "manifest.json").write_text('{"files": {}}')
    (project / "supabase/pgfence-init.json").symlink_to(outside / "manifest.json")
    code, _, err = run(capsys, "init", "--supabase", str(project))
    assert code == cli.EXIT_REFUSED and "pgfence-init.json is a symlink" in err
    assert written(outside) == {"manifest.json": '{"files": {}}'}


def test_a_symlink_put_there_after_the_check_is_not_written_through(tmp_path: Path) -> None:
    """The write itself refuses what the checks would have: O_EXCL for a new file (a dangling
    symlink put there meanwhile), O_NOFOLLOW for one it replaces."""
    project, outside = outside_and_inside(tmp_path)
    new = project / "supabase/new.ts"
    new.symlink_to(outside / "x.ts")
    with pytest.raises(init.InitError, match="not written"):
        init.write(new, "text", new=True, root=project)
    with pytest.raises(init.InitError, match="not written"):
        init.write(new, "text", new=False, root=project)
    assert written(outside) == {}


@pytest.mark.parametrize("how", ["symlink", "manifest"])
def test_negative_control_without_the_checks_init_writes_outside(
        tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the checks stop is real: with inside() a bare join and expected() always true (and
    a write that follows symlinks, as 0.2.1's did), the same projects make init write outside
    (issue 43's two findings, each exit 0)."""
    project, outside = outside_and_inside(tmp_path)
    if how == "symlink":
        (project / "supabase/functions/pgfence-worker").mkdir(parents=True)
        (project / "supabase/functions/pgfence-worker/index.ts").symlink_to(outside / "x.ts")
    else:
        (project / "supabase/pgfence-init.json").write_text(json.dumps(
            {"pgfence": "0.2.1", "files": {"migration:core": {
                "path": "../outside/x.sql", "sha256": "0" * 64,
                "release": Files().newest()}}}))
    monkeypatch.setattr(init.Project, "inside", lambda self, rel: self.dir / rel)
    monkeypatch.setattr(init.Project, "expected", lambda self, key, path: True)

    def follow(target: Path, text: str, *, new: bool, root: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    monkeypatch.setattr(init, "write", follow)
    init.Project(project, supabase=True, layers=[], role="service_role", cron=True,
                 now=NOW).run(dry_run=False)
    name = "x.ts" if how == "symlink" else "x.sql"
    assert (outside / name).read_text().startswith(("// Written by pgfence init", "-- pgfence"))


# --------------------------------------------------------------------------------------------
# A project an older release initialized: upgrade migrations, the applied ones left alone


def old_project(tmp_path: Path, layers: list[str], legacy: bool = True) -> tuple[Path, Files]:
    """A Supabase project that pgfence init 0.2.0 wrote (with the manifest 0.2.1's init wrote,
    which records no release: ``legacy``), and the package of that release."""
    project = tmp_path / "app"
    (project / "supabase/migrations").mkdir(parents=True)
    (project / "supabase/migrations/20250101000000_app.sql").write_text("create table t ();\n")
    old = Files(package_of("0.2.0", tmp_path / "package-0.2.0"))
    init.Project(project, supabase=True, layers=layers, role="service_role", cron=True,
                 files=old, now=NOW).run(dry_run=False)
    manifest = project / "supabase/pgfence-init.json"
    doc = json.loads(manifest.read_text())
    for key in ("flow-worker", "flow-worker:deno.json"):   # init 0.2.0 wrote no pgflow worker
        if (entry := doc["files"].pop(key, None)) is not None:
            (project / entry["path"]).unlink()
    if legacy:
        for entry in doc["files"].values():
            del entry["release"]
    manifest.write_text(json.dumps(doc))
    return project, old


def expected_upgrades(source: str, layers: list[str]) -> list[tuple[str, str]]:
    """(migration name, upgrade file) of each upgrade from `source`, in the order they must
    run: per release B, pgfence's file to B, then each layer's to B (it needs pgfence B)."""
    files, v = Files(), Files().newest()
    steps = [(release_key(u.target), 0, f"pgfence_upgrade_{u.target.replace('.', '_')}",
              u.name) for u in files.chain(source, v) or []]
    for i, layer in enumerate(layers, 1):
        steps += [(release_key(u.target), i,
                   f"pgfence_{layer}_upgrade_{u.target.replace('.', '_')}", u.name)
                  for u in files.layer_chain(layer, source, v)]
    return [(name, file) for *_, name, file in sorted(steps)]


@pytest.mark.parametrize("legacy", [True, False], ids=["manifest without releases", "with"])
def test_an_older_project_gets_upgrade_migrations(tmp_path: Path, legacy: bool) -> None:
    project, _ = old_project(tmp_path, ["pgmq", "pgflow"], legacy)
    before = written(project)
    (project / "supabase/migrations/20261203000000_later.sql").write_text("select 1;\n")
    later = NOW + dt.timedelta(days=3)
    doc = init.Project(project, supabase=True, layers=["pgmq", "pgflow"], role="service_role",
                       cron=True, now=later).run(dry_run=False)
    actions = {f["path"]: f["action"] for f in doc["files"]}
    new = [p for p, a in actions.items() if a == "write" and "/migrations/" in p]
    assert [p for p, a in actions.items() if a == "write" and p not in new] == [
        "supabase/functions/pgfence-flow-worker/index.ts",
        "supabase/functions/pgfence-flow-worker/deno.json"], "new since init 0.2.0"
    expected = expected_upgrades("0.2.0", ["pgmq", "pgflow"])
    # The pgflow layer changed in the next release: its upgrade comes right after pgfence's.
    assert [name for name, _ in expected[:2]] == ["pgfence_upgrade_0_2_1",
                                                  "pgfence_pgflow_upgrade_0_2_1"]
    assert [re.sub(r"\d{14}", "T", p) for p in new] == [
        f"supabase/migrations/T_{name}.sql" for name, _ in expected]
    # Dated after the project's last migration (and now), one second apart, in order.
    stamps = [int(p.split("/")[-1][:14]) for p in new]
    assert stamps == list(range(20261205073000, 20261205073000 + len(new)))
    files = written(project)
    for path, (_, upgrade) in zip(new, expected, strict=True):
        assert files[path].endswith((ROOT / "sql/upgrades" / upgrade).read_text())
    # What was written (and applied) before is left alone; the grants and cron SQL is the same.
    for path, text in before.items():
        if path != "supabase/pgfence-init.json" and "/functions/" not in path:
            assert files[path] == text, path
    assert {a for p, a in actions.items() if "/migrations/" in p and p not in new} == {"keep"}
    manifest = json.loads(files["supabase/pgfence-init.json"])["files"]
    v = Files().newest()
    assert manifest[f"migration:core@{v}"]["release"] == v
    # And again: nothing to write.
    again = init.Project(project, supabase=True, layers=["pgmq", "pgflow"],
                         role="service_role", cron=True, now=later).run(dry_run=False)
    assert not again["changed"]
    assert {f["action"] for f in again["files"]} == {"keep"}


def test_a_layer_added_to_an_older_project_comes_after_the_upgrade(tmp_path: Path) -> None:
    project, _ = old_project(tmp_path, [])
    doc = init.Project(project, supabase=True, layers=["pgmq"], role="service_role", cron=True,
                       now=NOW).run(dry_run=False)
    new = [re.sub(r"\d{14}", "T", f["path"]) for f in doc["files"] if f["action"] == "write"]
    upgrades = [f"supabase/migrations/T_{name}.sql" for name, _ in expected_upgrades("0.2.0", [])]
    assert new[:len(upgrades) + 1] == [*upgrades, "supabase/migrations/T_pgfence_pgmq.sql"]


def test_a_changed_migration_of_an_older_project_is_still_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project, _ = old_project(tmp_path, [])
    (cron,) = (project / "supabase/migrations").glob("*_pgfence_cron.sql")
    cron.write_text(cron.read_text() + "-- mine\n")
    before = written(project)
    code, _, err = run(capsys, "init", "--supabase", str(project))
    assert code == cli.EXIT_REFUSED and "changed since init wrote it" in err
    assert written(project) == before


def test_a_project_a_newer_release_initialized_is_refused(tmp_path: Path) -> None:
    project, _ = old_project(tmp_path, [], legacy=False)
    with pytest.raises(init.InitError, match="newer than this package"):
        init.Project(project, supabase=True, layers=[], role="service_role", cron=True,
                     files=Files(package_of("0.1.0", tmp_path / "package-0.1.0")),
                     now=NOW).run(dry_run=False)


def test_the_documented_upgrade_listing_is_what_init_prints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs/supabase.md").read_text()
    block = re.search(r"<!-- init upgrade listing:[^>]*-->\s*```console\n\$ (.*?)\n(.*?)```",
                      text, re.S)
    assert block, "docs/supabase.md has no init upgrade listing"
    project, _ = old_project(tmp_path, ["pgmq", "pgflow"])
    monkeypatch.chdir(project)
    code, out, err = run(capsys, *block.group(1).split()[1:])
    assert code == 0, err
    stamp = re.compile(r"\d{14}")
    # The new migrations are dated now: the listing's stamps stand for any.
    assert stamp.sub("T", out) == stamp.sub("T", block.group(2))


def test_the_supervisor_is_a_migration_after_the_cron_jobs(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "init", "--supabase", str(project), "--supervise", "a b")[0] == 2
    assert run(capsys, "init", "--supabase", str(project), "--no-cron", "--supervise",
               "emails")[0] == 2
    plan = init.Project(project, supabase=True, layers=[], role="service_role", cron=True,
                        supervise="emails", now=NOW).plan()
    assert [p.path for p in plan if p.migration][-2:] == [
        "supabase/migrations/20261202073002_pgfence_cron.sql",
        "supabase/migrations/20261202073003_pgfence_supervisor.sql"]
    (job,) = [p.text for p in plan if p.key == "migration:supervisor"]
    assert "select cron.schedule(E'pgfence-supervise-emails'," in job
    assert "v_invocation := pgfence.request_start(E'emails');" in job


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
