"""The real package and the negative controls: the same campaign against deliberately broken
copies of pgfence's own functions. A checker that never fails proves nothing."""

from __future__ import annotations

from dataclasses import dataclass

from testkit.harness import Database


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    # (function signature, text in its definition, replacement): each a one-place break
    breaks: tuple[tuple[str, str, str], ...] = ()
    advisory: bool = False               # workers lock with pg_try_advisory_lock instead

    def install(self, dsn: str) -> None:
        db = Database(dsn)
        try:
            for signature, old, new in self.breaks:
                db.replace_in_function(signature, old, new)
        finally:
            db.close()


HOLD = "pgfence.hold_current(uuid)"  # the lease-current check fence and claim share
IS_CURRENT = "pgfence.is_current(text, timestamptz)"
REPORT = "pgfence.report(uuid, text, jsonb)"

VARIANTS = {v.name: v for v in (
    Variant("real", "pgfence as installed"),
    # Without the lock, a worker paused inside its fenced transaction is still stopped by the
    # idle limit fence sets (its session ends when its lease runs out), which would hide the
    # missing lock from this campaign, whose pauses leave the transaction idle. The control is
    # about the lock, so it lifts the limit too; a busy (not idle) frozen owner needs the lock.
    Variant("no-lock", "fence and claim without FOR KEY SHARE on the lease row "
            "(and without the idle limit)", (
        (HOLD, "for key share;", ";"),
        (HOLD, "set_config('idle_in_transaction_session_timeout',",
         "set_config('pgfence.unused',"))),
    Variant("now", "fence and claim judge expiry by now(), the transaction's start", (
        (IS_CURRENT, "pg_catalog.clock_timestamp()", "pg_catalog.now()"),)),
    Variant("no-attempt-check", "complete/fail accept a superseded attempt's result", (
        (REPORT, "if v_attempt < v_task.attempt then", "if false then"),)),
    Variant("advisory", "a session advisory lock through PgBouncer instead of a lease; "
            "unfenced writes", advisory=True),
)}
CONTROLS = tuple(name for name in VARIANTS if name != "real")
