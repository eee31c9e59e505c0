"""The live demo tells its story: the frozen owner's write is refused, every email is sent
exactly once, each under the generation that owned the resource."""

from __future__ import annotations

import subprocess
import sys

from testkit.harness import Database
from tests.support import HUNG, ROOT


def test_live_demo(db: Database) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts/demo.py"), db.dsn],
                         capture_output=True, text=True, timeout=HUNG)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "A          write of email 4 REFUSED" in out.stdout
    assert "B          acquired the lease" in out.stdout
    rows = db.sql("select n, sent_by, generation from sent_emails order by n")
    assert [n for n, _, _ in rows] == list(range(1, 9))
    generations = dict(db.sql("select owner, generation from pgfence.leases"))
    assert all(generation == generations[who] for _, who, generation in rows)
    assert db.one("select count(*) from pgfence.tasks where state = 'completed'") == 8
