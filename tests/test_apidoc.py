"""The API reference (scripts/apidoc) builds from the doc comments without a warning: what CI
checks. Its negative control: a module whose ``__all__`` names nothing fails the build."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import ROOT


def apidoc(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "scripts/apidoc"), str(out)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


def test_the_python_reference_builds_without_warnings(tmp_path: Path) -> None:
    built = apidoc(tmp_path)
    assert built.returncode == 0 and built.stderr == "", built.stderr
    pages = {p.relative_to(tmp_path / "python").as_posix()
             for p in (tmp_path / "python").rglob("*.html")}
    assert {"pgfence.html", "pgfence/client.html", "pgfence/aio.html",
            "pgfence/connection.html"} <= pages
    assert "pgfence/_core.html" not in pages             # private: shown where exported
    client = (tmp_path / "python/pgfence/client.html").read_text()
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
