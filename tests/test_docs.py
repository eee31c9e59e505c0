"""The README's SQL example runs as written."""

from __future__ import annotations

import re
import subprocess

from pgfence.harness import Database
from tests.conftest import ROOT


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- README example[^>]*-->\s*```sql\n(.*?)```", text, flags=re.S)
    assert match, "README has no marked SQL example"
    return match.group(1)


def test_readme_example_runs_as_written(db: Database) -> None:
    dbname = db.one("select current_database()")
    out = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", dbname],
                         input=readme_example(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert db.sql("select amount from invoices") == [(42,)]
    assert db.one("select status from pgfence.lease_status") == "released"
