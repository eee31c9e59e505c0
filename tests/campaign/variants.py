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
    fleets: tuple[str, ...] = ("core",)  # the fleets whose work it breaks (Settings.fleet)

    def install(self, dsn: str) -> None:
        db = Database(dsn)
        try:
            db.install_mutant(*self.mutants)
        finally:
            db.close()


VARIANTS = {v.name: v for v in (
    Variant("real", "pgfence as installed", fleets=("core", "layers")),
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
    # The layers' fleet: a result of an attempt that no longer holds its work, accepted.
    Variant("pgflow-stale-complete", "the pgflow layer's complete_task accepts the result of "
            "an attempt whose task was started again since",
            ("pgflow-finish-ignores-attempts-count",), fleets=("layers",)),
    # (Both witnesses of a later read: the message's read count and, from 0.3.0, the layer's
    # own record of reads.)
    Variant("pgmq-stale-archive", "the pgmq layer's archive accepts a read whose message was "
            "read again since",
            ("pgmq-finish-ignores-read-ct", "pgmq-finish-many-ignores-read-ct",
             "pgmq-finish-ignores-later-read"),
            fleets=("layers",)),
    # ... and a task started again while its attempt may still hold it.
    # (From 0.3.0 a read takes a task over only once it has stalled, too: both rules go.)
    Variant("pgflow-early-takeover", "the pgflow layer's start hides a started task's message "
            "for the read's vt only, not its step's timeout + 2 s, and takes over a task that "
            "has not stalled: a live task is taken over",
            ("pgflow-start-read-vt-only", "pgflow-takeover-not-stalled"), fleets=("layers",)),
)}


def controls(fleet: str) -> tuple[str, ...]:
    """The negative controls of ``fleet``."""
    return tuple(n for n, v in VARIANTS.items() if n != "real" and fleet in v.fleets)


CONTROLS = controls("core")
