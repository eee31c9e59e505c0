"""The API reference (scripts/apidoc) builds from the doc comments without a warning: what CI
checks, for both clients. Its negative controls: a Python module whose ``__all__`` names
nothing, and the Deno client with one export undocumented, fail the build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import DENO, HUNG, ROOT

CLIENT = ROOT / "clients/deno"


def apidoc(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "scripts/apidoc"), str(out)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=HUNG)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference, built once for this module's tests."""
    out = tmp_path_factory.mktemp("apidoc")
    built = apidoc(out)
    assert built.returncode == 0 and built.stderr == "", built.stderr
    return out


def test_the_python_reference_builds_without_warnings(reference: Path) -> None:
    pages = {p.relative_to(reference / "python").as_posix()
             for p in (reference / "python").rglob("*.html")}
    assert {"pgfence.html", "pgfence/client.html", "pgfence/aio.html",
            "pgfence/connection.html"} <= pages
    assert "pgfence/_core.html" not in pages             # private: shown where exported
    client = (reference / "python/pgfence/client.html").read_text()
    for name in ("Owner", "Worker", "Leader", "Context", "Retry", "Task", "LeaseLost"):
        assert f'id="{name}"' in client, name
    # Docstrings, not just names: the handler context's extend() and its rule.
    assert "moves the handler&#39;s deadline" in client or "moves the handler's deadline" in client


def test_negative_control_a_warning_fails_the_build(tmp_path: Path) -> None:
    package = tmp_path / "src/brokenpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A package."""\n__all__ = ["missing"]\n')
    built = apidoc(tmp_path / "out", APIDOC_PYTHON="brokenpkg",
                   PYTHONPATH=str(tmp_path / "src"))
    assert built.returncode != 0
    assert "does not resolve" in built.stderr


def test_the_deno_reference_builds_without_warnings(reference: Path) -> None:
    """A page for every symbol mod.ts exports (as `deno doc --json` lists them), and pgflow.ts's."""
    listed = subprocess.run([str(DENO), "doc", "--json", "mod.ts"], cwd=CLIENT,
                            capture_output=True, text=True, timeout=HUNG)
    assert listed.returncode == 0, listed.stderr
    (module,) = json.loads(listed.stdout)["nodes"].values()
    exported = {s["name"] for s in module["symbols"]
                if any(d["declarationKind"] == "export" for d in s["declarations"])}
    assert {"Owner", "Worker", "connect", "errorClasses", "ConnectionLost"} <= exported
    missing = [name for name in sorted(exported)
               if not (reference / "deno/~" / f"{name}.html").exists()]
    assert not missing, f"no page for {missing}"
    assert (reference / "deno/index.html").exists()
    # deno.json names the package's entry points: "." (mod.ts) at the top, "./pgflow" below.
    assert (reference / "deno/pgflow/~/FlowWorker.html").exists()
    # Doc comments, not just names: the Worker's visibility rule.
    worker = (reference / "deno/~/Worker.html").read_text()
    assert "remaining visibility" in worker


def test_negative_control_an_undocumented_deno_export_fails_the_build(tmp_path: Path) -> None:
    client = tmp_path / "client"
    client.mkdir()
    for name in ("deno.json", "pgflow.ts"):
        shutil.copy(CLIENT / name, client / name)
    (client / "node_modules").symlink_to(CLIENT / "node_modules")
    doc = "/** Seconds on a monotonic clock. */\n"
    source = (CLIENT / "mod.ts").read_text()
    assert doc + "export type Clock" in source
    (client / "mod.ts").write_text(source.replace(doc, ""))
    built = apidoc(tmp_path / "out", APIDOC_DENO=str(client))
    assert built.returncode != 0
    assert "missing-jsdoc" in built.stderr, built.stderr


def test_negative_control_an_undocumented_pgflow_export_fails_the_build(tmp_path: Path) -> None:
    """pgflow.ts is linted too: a public name of it without its doc comment fails."""
    client = tmp_path / "client"
    client.mkdir()
    for name in ("deno.json", "mod.ts"):
        shutil.copy(CLIENT / name, client / name)
    (client / "node_modules").symlink_to(CLIENT / "node_modules")
    doc = "  /** The flow's slug (and queue). */\n"
    source = (CLIENT / "pgflow.ts").read_text()
    assert doc + "  readonly flowSlug: string;" in source
    (client / "pgflow.ts").write_text(source.replace(doc, ""))
    built = apidoc(tmp_path / "out", APIDOC_DENO=str(client))
    assert built.returncode != 0
    assert "missing-jsdoc" in built.stderr, built.stderr
