"""The real package and the negative controls: the same campaign against deliberately broken
copies of pgfence's own functions, mutants of the one catalogue (tests/mutation/mutants.toml).
A checker that never fails proves nothing."""

from __future__ import annotations

from dataclasses import dataclass

from testkit.harness import Database


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    mutants: tuple[str, ...] = ()        # the catalogue's ids: each a one-place break
    advisory: bool = False               # workers lock with pg_try_advisory_lock instead

    def install(self, dsn: str) -> None:
        db = Database(dsn)
        try:
            db.install_mutant(*self.mutants)
        finally:
            db.close()


VARIANTS = {v.name: v for v in (
    Variant("real", "pgfence as installed"),
    # Without the lock, a worker paused inside its fenced transaction is still stopped by the
    # idle limit fence sets (its session ends when its lease runs out), which would hide the
    # missing lock from this campaign, whose pauses leave the transaction idle. The control is
    # about the lock, so it lifts the limit too; a busy (not idle) frozen owner needs the lock.
    Variant("no-lock", "fence and claim without FOR KEY SHARE on the lease row "
            "(and without the idle limit)", ("hold-current-no-lock", "idle-limit-never-set")),
    Variant("now", "fence and claim judge expiry by now(), the transaction's start",
            ("is-current-now",)),
    Variant("no-attempt-check", "complete/fail accept a superseded attempt's result",
            ("report-accepts-older-attempt",)),
    Variant("advisory", "a session advisory lock through PgBouncer instead of a lease; "
            "unfenced writes", advisory=True),
)}
CONTROLS = tuple(name for name in VARIANTS if name != "real")
