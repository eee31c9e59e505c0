"""How the packages are really installed (issue 29, item 6): the Python wheel is built from a
clone with scripts/build (no index has it), and the Deno client is imported by its deno.json
name and exports from outside the repository (a Deno workspace whose member is a copy of
clients/deno), offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from pgfence import __version__
from tests.support import DENO, HUNG, ROOT

CLIENT = ROOT / "clients/deno"


def test_scripts_build_prints_the_wheel_it_built(tmp_path: Path) -> None:
    out = subprocess.run([ROOT / "scripts/build", tmp_path / "dist"], capture_output=True,
                         text=True, timeout=HUNG)
    assert out.returncode == 0, out.stderr
    wheel = Path(out.stdout.strip())
    assert wheel == tmp_path / "dist" / f"pgfence-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    # What `pgfence version` and `upgrade` read, besides the install and upgrade files.
    assert {"pgfence/cli.py", "pgfence/schema/pgfence.sql", "pgfence/schema/releases/fingerprints",
            "pgfence/schema/queries/fingerprint.sql",
            "pgfence/schema/queries/sqitch_registry.sql"} <= names


def test_the_readme_installs_the_package_as_it_really_is() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/build" in readme
    # No index has pgfence: nothing tells users to fetch it from one.
    assert "pip install pgfence" not in readme and "pip install -U pgfence" not in readme
    assert "pip install -U pgfence" not in (ROOT / "src/pgfence/cli.py").read_text()


def workspace(tmp_path: Path, deno_json: dict[str, object] | None = None) -> Path:
    """A Deno workspace outside the repository: member `client` is a copy of clients/deno
    (its deno.json as given), member `app` imports it by name only."""
    top = tmp_path / "ws"
    shutil.copytree(CLIENT, top / "client", symlinks=True,
                    ignore=shutil.ignore_patterns("node_modules", "testdata", "*_test.ts"))
    if deno_json is not None:
        (top / "client/deno.json").write_text(json.dumps(deno_json))
    # postgres.js, as scripts/setup put it (offline: nothing is fetched).
    (top / "node_modules").symlink_to(ROOT / ".tools/node_modules")
    (top / "deno.json").write_text(json.dumps(
        {"workspace": ["./client", "./app"], "nodeModulesDir": "manual", "lock": False}))
    (top / "app").mkdir()
    (top / "app/deno.json").write_text(json.dumps(
        {"name": "@example/app", "version": "0.0.0", "exports": "./main.ts"}))
    (top / "app/main.ts").write_text(
        'import { connect, Owner, Worker } from "@pgfence/client";\n'
        'import * as pgflow from "@pgfence/client/pgflow";\n'
        "console.log(JSON.stringify({ connect: typeof connect, owner: typeof Owner,\n"
        "  worker: typeof Worker, pgflow: Object.keys(pgflow).length }));\n")
    return top


def run_app(top: Path, deno_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DENO), "run", "--no-remote", "--cached-only", "app/main.ts"],
                          cwd=top, capture_output=True, text=True, timeout=HUNG,
                          env={**deno_env, "HOME": str(top)})


def metadata() -> dict[str, object]:
    meta: dict[str, object] = json.loads((CLIENT / "deno.json").read_text())
    return meta


def test_the_deno_client_imports_by_its_name_and_exports(tmp_path: Path,
                                                         deno_env: dict[str, str]) -> None:
    meta = metadata()
    assert meta["name"] == "@pgfence/client" and meta["version"] == __version__
    assert meta["exports"] == {".": "./mod.ts", "./pgflow": "./pgflow.ts"}
    out = run_app(workspace(tmp_path), deno_env)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["connect"] == found["owner"] == found["worker"] == "function"
    assert found["pgflow"] > 0


@pytest.mark.parametrize("broken", ["name", "exports"])
def test_negative_control_without_the_metadata_the_import_fails(
        tmp_path: Path, deno_env: dict[str, str], broken: str) -> None:
    meta = metadata()
    if broken == "name":
        meta["name"] = "@someone/else"
    else:
        meta["exports"] = {".": "./mod.ts"}       # no ./pgflow
    out = run_app(workspace(tmp_path, meta), deno_env)
    assert out.returncode != 0
    assert "@pgfence/client" in out.stderr, out.stderr

