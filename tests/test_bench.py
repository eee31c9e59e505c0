"""The benchmark driver works end to end (scripts/bench --quick: every pgbench script runs,
a few transactions per client, and every property on small sizes). Its numbers are not
asserted: speed is judged in docs/performance.md from a full run, never in a test."""

from __future__ import annotations

import subprocess

from tests.support import HUNG, ROOT


def test_bench_quick_runs_every_pair() -> None:
    out = subprocess.run([str(ROOT / "scripts/bench"), "--quick"],
                         capture_output=True, text=True, timeout=HUNG)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for section in ("renew", "claim", "complete", "takeover latency", "completed history",
                    "pgflow workers"):
        assert section in out.stdout, section
