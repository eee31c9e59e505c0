"""The wheel as users get it: `pip install "$(scripts/build)"` (README). scripts/build makes it
here too, from a copy of what it reads; a fresh venv with nothing but that wheel and its
dependencies installs pgfence into a fresh database with `pgfence --db-url URL install`, and
`pgfence init` writes the Deno client the wheel carries (src/pgfence/deno, a symlink to
clients/deno that the wheel must resolve)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgfence.releases import Files
from testkit.cluster import Cluster
from tests.support import HUNG, ROOT, once_per_run

# How scripts/build takes the Deno client into the copy it builds from.
COPIES_DENO = """mkdir "$work/clients"
cp -a "$root/clients/deno" "$work/clients/"
"""


def source_tree(dest: Path, copies_deno: bool = True) -> Path:
    """What scripts/build reads, copied (symlinks as symlinks), with the script itself and a
    link to the project's venv, so a copy can be changed and built as the repository is.
    ``copies_deno=False``: the script as it was before it copied clients/deno, whose wheel's
    src/pgfence/deno dangled."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest)
    (dest / "scripts").mkdir()
    build = (ROOT / "scripts/build").read_text()
    assert COPIES_DENO in build
    (dest / "scripts/build").write_text(build if copies_deno else build.replace(COPIES_DENO, ""))
    (dest / "scripts/build").chmod(0o755)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    shutil.copytree(ROOT / "src", dest / "src", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "sql", dest / "sql")
    shutil.copytree(ROOT / "clients/deno", dest / "clients/deno", symlinks=True,
                    ignore=shutil.ignore_patterns("node_modules"))
    assert (dest / "src/pgfence/schema").is_symlink()
    assert (dest / "src/pgfence/deno").is_symlink()
    return dest


def build_wheel(source: Path, out: Path) -> Path:
    """scripts/build of ``source`` (the repository or a copy of it): the wheel it printed."""
    built = subprocess.run([str(source / "scripts/build"), str(out)], capture_output=True,
                           text=True, timeout=HUNG)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = Path(built.stdout.strip())
    assert wheel.parent == out.resolve() and wheel.is_file()
    return wheel


def repository_sql() -> dict[str, bytes]:
    # The SQL files, and the fingerprints `pgfence version` compares a schema (core and each
    # layer) with.
    files = [*sorted((ROOT / "sql").rglob("*.sql")),
             *sorted((ROOT / "sql/releases").glob("fingerprints*"))]
    return {f"pgfence/schema/{p.relative_to(ROOT / 'sql')}": p.read_bytes() for p in files}


@pytest.fixture(scope="session")
def wheel(pytestconfig: pytest.Config) -> Path:
    """scripts/build of the repository itself, once per run, whichever xdist worker asks first
    (about 45 s)."""
    return Path(once_per_run(pytestconfig, "wheel",
                             lambda work: str(build_wheel(ROOT, work / "out"))))


@pytest.fixture
def fresh_database(cluster: Cluster) -> Iterator[str]:
    name = f"wheel_{uuid.uuid4().hex[:10]}"
    cluster.create_database(name)
    yield name
    cluster.drop_database(name)


def test_the_wheel_carries_every_sql_file(wheel: Path) -> None:
    expected = repository_sql()
    assert "pgfence/schema/pgfence.sql" in expected
    with zipfile.ZipFile(wheel) as z:
        inside = {n: z.read(n) for n in z.namelist() if n.startswith("pgfence/schema/")}
    assert inside == expected          # the same files, byte for byte, and nothing else


# What `pgfence init` writes into a project: the Deno client, its postgres.js pin, the worker.
DENO_FILES = ("mod.ts", "pgflow.ts", "deno.json", "examples/supabase_worker.ts",
              "examples/pgflow_edge_function.ts")


def test_the_wheel_carries_the_deno_client_init_writes(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        inside = {n: z.read(n) for n in z.namelist() if n.startswith("pgfence/deno/")}
    assert inside == {f"pgfence/deno/{n}": (ROOT / "clients/deno" / n).read_bytes()
                      for n in DENO_FILES}   # and none of its tests or node_modules


def test_the_wheel_ships_no_test_kit(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        modules = {n for n in z.namelist() if n.endswith(".py")}
    assert "pgfence/client.py" in modules and "pgfence/connection.py" in modules
    assert not [n for n in modules if n.startswith("testkit/")
                or n.rsplit("/", 1)[-1] in ("cluster.py", "harness.py", "permutations.py")]


def test_negative_control_without_the_package_data_the_wheel_has_no_sql(tmp_path: Path) -> None:
    copy = source_tree(tmp_path / "repo")
    pyproject = (ROOT / "pyproject.toml").read_text()
    globs = ('"schema/*.sql", "schema/releases/*.sql", "schema/releases/fingerprints*",\n'
             '           "schema/upgrades/*.sql", "schema/queries/*.sql"')
    assert globs in pyproject
    (copy / "pyproject.toml").write_text(pyproject.replace(", " + globs, ""))
    with zipfile.ZipFile(build_wheel(copy, tmp_path / "out")) as z:
        assert not [n for n in z.namelist() if n.endswith(".sql")]


def test_negative_control_without_the_deno_package_data_the_wheel_has_no_client(
        tmp_path: Path) -> None:
    copy = source_tree(tmp_path / "repo")
    pyproject = (ROOT / "pyproject.toml").read_text()
    globs = ", ".join(f'"deno/{n}"' for n in DENO_FILES)
    assert globs in pyproject
    (copy / "pyproject.toml").write_text(pyproject.replace(globs, ""))
    with zipfile.ZipFile(build_wheel(copy, tmp_path / "out")) as z:
        assert not [n for n in z.namelist() if n.startswith("pgfence/deno/")]


def venv_with(wheel: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh venv with nothing but ``wheel`` and its dependencies, and an environment that
    keeps the repository off the path: only the installed wheel runs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=HUNG)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], check=True,
                   capture_output=True, text=True, timeout=HUNG)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return venv, env


def pgfence_init(venv: Path, env: dict[str, str],
                 tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`pgfence init --plain --layers pgmq,pgflow` in a new project, from the installed wheel
    alone (the README's quick start)."""
    project = tmp_path / "project"
    project.mkdir()
    return subprocess.run([str(venv / "bin/pgfence"), "init", "--plain", "--layers",
                           "pgmq,pgflow"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=HUNG)


def test_a_fresh_venv_with_the_wheel_installs_a_database(wheel: Path, fresh_database: str,
                                                         cluster: Cluster, tmp_path: Path) -> None:
    venv, env = venv_with(wheel, tmp_path)
    # The client imports with nothing but the wheel: it needs no part of the test kit.
    show = ("import pgfence, pgfence.client, pathlib;"
            " print(pathlib.Path(pgfence.__file__).parent)")
    where = subprocess.run([str(venv / "bin/python"), "-c", show], cwd=tmp_path, env=env,
                           check=True, capture_output=True, text=True).stdout.strip()
    package = Path(where)
    assert package.is_relative_to(venv)
    schema = package / "schema"
    assert schema.is_dir() and not schema.is_symlink()
    assert (schema / "pgfence.sql").read_bytes() == (ROOT / "sql/pgfence.sql").read_bytes()

    port = cluster.port
    url = f"postgresql://postgres@127.0.0.1:{port}/{fresh_database}"
    out = subprocess.run([str(venv / "bin/pgfence"), "--db-url", url, "install", "--confirm",
                          f"127.0.0.1:{port}/{fresh_database}"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=HUNG)
    assert out.returncode == 0, out.stdout + out.stderr
    newest = Files().newest()
    assert f"pgfence {newest} is installed" in out.stdout
    with psycopg.connect(cluster.dsn(fresh_database)) as conn:
        assert conn.execute("select pgfence.version()").fetchone() == (newest,)
    version = subprocess.run([str(venv / "bin/pgfence"), "--db-url", url, "version"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HUNG)
    assert version.returncode == 0 and "up to date" in version.stdout, version.stderr
    # Every release from the wheel alone, no git tag or checkout: the oldest, then upgraded.
    oldest = Files().known()[0]
    cluster.create_database(f"{fresh_database}_old")
    old_url, old_name = f"{url}_old", f"127.0.0.1:{port}/{fresh_database}_old"
    try:
        for args in (["install", "--to", oldest], ["upgrade"]):
            step = subprocess.run([str(venv / "bin/pgfence"), "--db-url", old_url, "--json",
                                   *args, "--confirm", old_name], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=HUNG)
            assert step.returncode == 0, step.stdout + step.stderr
            assert json.loads(step.stdout)["installed"] == (oldest if args[0] == "install"
                                                            else newest)
    finally:
        cluster.drop_database(f"{fresh_database}_old")

    # pgfence init from the wheel alone: the Deno client it writes is the repository's.
    init = pgfence_init(venv, env, tmp_path)
    assert init.returncode == 0, init.stdout + init.stderr
    assert "wrote      pgfence/deno/pgflow.ts" in init.stdout
    mod = (tmp_path / "project/pgfence/deno/mod.ts").read_text()
    assert mod.endswith((ROOT / "clients/deno/mod.ts").read_text().replace(
        'from "postgres";', 'from "npm:postgres@3.4.9";'))


def test_negative_control_a_wheel_without_the_deno_client_fails_init(tmp_path: Path) -> None:
    # What scripts/build made before it copied clients/deno: the symlink src/pgfence/deno
    # dangled, the wheel had no Deno file, and init crashed (FileNotFoundError .../deno.json).
    wheel = build_wheel(source_tree(tmp_path / "repo", copies_deno=False), tmp_path / "out")
    with zipfile.ZipFile(wheel) as z:
        assert not [n for n in z.namelist() if n.startswith("pgfence/deno/")]
    venv, env = venv_with(wheel, tmp_path)
    init = pgfence_init(venv, env, tmp_path)
    assert init.returncode != 0 and "deno.json" in init.stderr, init.stdout + init.stderr
    assert not (tmp_path / "project/pgfence/deno/mod.ts").exists()
