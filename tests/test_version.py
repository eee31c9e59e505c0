"""One version source: ``pgfence.__version__`` (which the wheel's metadata reads, see
pyproject.toml). Everything else that names the release must agree with it: the one-file
install's header (scripts/bundle takes it from the plan's newest `version` change, the body of
``pgfence.version()``), the Sqitch tags, the Deno client's deno.json, the CHANGELOG."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
from pathlib import Path

import pgfence
from pgfence.releases import Files, key
from tests.support import ROOT


def disagreements(root: Path, version: str) -> list[str]:
    """Each place under ``root`` that names another release than ``version``."""
    found = []
    newest = Files(root / "sql").newest()
    if newest != version:
        found.append(f"sql/pgfence.sql installs {newest}")
    deno = json.loads((root / "clients/deno/deno.json").read_text()).get("version")
    if deno != version:
        found.append(f"clients/deno/deno.json says {deno}")
    tags = re.findall(r"^@v(\S+)", (root / "sqitch.plan").read_text(), re.M)
    if any(key(tag) > key(version) for tag in tags):
        found.append(f"sqitch.plan tags a release newer than {version}: {tags}")
    if version in tags and tags[-1] != version:
        found.append(f"sqitch.plan tags {version} before {tags[-1]}")
    for tag in tags:
        if not (root / f"sql/releases/pgfence--{tag}.sql").is_file() and tag != version:
            found.append(f"the released {tag} has no sql/releases/pgfence--{tag}.sql")
    if not re.search(rf"^## {re.escape(version)} - ", (root / "CHANGELOG.md").read_text(), re.M):
        found.append(f"CHANGELOG.md has no heading for {version}")
    return found


def test_every_place_names_the_package_version() -> None:
    assert importlib.metadata.version("pgfence") == pgfence.__version__
    assert disagreements(ROOT, pgfence.__version__) == []


def test_a_place_that_lags_is_named(tmp_path: Path) -> None:
    # Negative control: the same check on a copy whose Deno client still says 0.1.0.
    for name in ("sqitch.plan", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "sql", tmp_path / "sql")
    (tmp_path / "clients/deno").mkdir(parents=True)
    deno = json.loads((ROOT / "clients/deno/deno.json").read_text())
    (tmp_path / "clients/deno/deno.json").write_text(json.dumps({**deno, "version": "0.1.0"}))
    assert disagreements(tmp_path, pgfence.__version__) == ["clients/deno/deno.json says 0.1.0"]
    assert disagreements(tmp_path, "9.9.9")[0] == f"sql/pgfence.sql installs {pgfence.__version__}"
