"""The campaign's settings and its seeded schedule of faults.

A schedule is a function of its seed alone: the same seed gives the same faults, in the same
order, after the same gaps, with the same durations and parameters. What a fault hits is
decided when it is applied, by a rule ("the current owner of r1") and the event's ``pick``,
so the run itself is not replayable: processes and the database keep real time.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    # What the workers work: "core", pgfence's own queue; "layers", the layers' fleet (LAYERS).
    fleet: str = "core"
    resources: tuple[str, ...] = ("r0", "r1")
    queue: str = "jobs"
    ttl: float = 1.5                 # lease ttl; the owner renews every ttl / 3
    visibility: float = 2.5          # a claimed task's visibility
    work: float = 0.08               # the handler's work, inside its fenced transaction
    poll: float = 1.0                # a standby's acquire poll
    idle_wait: float = 0.3           # an owner's wait when the queue is empty
    qty: int = 3                     # a Python worker's batch (its hold: qty * visibility)
    initial_tasks: int = 20
    enqueue_every: float = 0.4       # while faults are applied
    max_attempts: int = 100          # faults cost attempts; a task must not fail for good
    random_faults: int = 6           # beside the ones every schedule has
    progress_bound: float = 15.0     # every task finishes this long after the last fault
    # The injector's waits for the moment a fault is about (an owner to arm, a successor, a
    # re-claim) are bounded by their durations above times this; a run whose faults missed
    # their moments on a slow machine is given more (tests/campaign/test_campaign.py).
    patience: float = 1.0
    # The layers' fleet: the pgflow of the database ("0.14.1" or "0.8.1"), the flow's step
    # timeout (a started task's message stays hidden for it + 2 s), and an Edge isolate's
    # beforeunload (wall_clock) and hard wall-clock limit, seconds after its boot (times the
    # patience: no pause of the injector's outlasts the limit).
    pgflow: str = "0.14.1"
    flow_timeout: int = 3             # (@pgflow/dsl allows no less)
    beforeunload: float = 5.0
    wall_clock: float = 40.0


# The layers' fleet: each resource and the layer its workers work. "mq": Python PgmqWorkers
# (pgfence.client) over pgmq queue `jobs`; "flows": Deno FlowWorkers, one Edge isolate per
# invocation (clients/deno/testdata/campaign_flow.ts), over pgflow flow `camp`.
LAYERS = {"mq": "pgmq", "flows": "pgflow"}
FLOW = "camp"


def layer_settings() -> Settings:
    """The settings of the layers' fleet."""
    return Settings(fleet="layers", resources=tuple(LAYERS), visibility=1.5, initial_tasks=10,
                    enqueue_every=1.0, work=0.05)


# Every schedule has these, so that each negative control meets the fault that exposes it.
ALWAYS = ("pause-before-fence", "pause-in-fence", "pause-before-complete", "restart")
RANDOM = ("stop", "kill", "terminate", "drop", "partition", "restart")
# The layers' fleet: the pause between the fenced write and the result once for each resource,
# and faults of processes, backends and the pooler (its workers all go through PgBouncer).
LAYER_EACH = ("pause-before-complete",)
LAYER_ALWAYS = ("kill", "terminate", "pooler")
LAYER_RANDOM = ("stop", "kill", "terminate", "pooler")
# Operator actions, in the middle of the schedule.
MIDDLE = ("deprecate", "update")
# The answers a relay can lose: a commit that happened, a renewal, a claim, a granted lease.
DROPPED = ("COMMIT", "pgfence.renew", "pgfence.claim", "pgfence.acquire")


@dataclass(frozen=True)
class Event:
    gap: float           # seconds after the previous event ended
    kind: str
    resource: str        # whose owner or workers it aims at
    duration: float      # how long a stop, partition or update window lasts
    param: str           # drop: the message whose answer is lost; kill: owner or any;
                         # pause-before-fence: seconds past expiry to resume; update: request id
    pick: float          # which one, when several candidates fit (0 <= pick < 1)

    def __str__(self) -> str:
        extra = f" {self.duration:.2f}s" if self.duration else ""
        return f"+{self.gap:.2f}s {self.kind} {self.resource}{extra} {self.param}".rstrip()


def make_schedule(seed: str, s: Settings) -> list[Event]:
    rng = random.Random(seed)
    kinds: list[tuple[str, str | None]]     # a kind, and its resource if it has one already
    if s.fleet == "layers":
        kinds = [(k, r) for k in LAYER_EACH for r in s.resources]
        kinds += [(k, None) for k in LAYER_ALWAYS]
        kinds += [(rng.choice(LAYER_RANDOM), None) for _ in range(s.random_faults)]
    else:
        kinds = [(k, None) for k in ALWAYS]
        kinds += [(rng.choice(RANDOM), None) for _ in range(s.random_faults)]
    rng.shuffle(kinds)
    middle = len(kinds) // 2
    kinds[middle:middle] = [(k, None) for k in MIDDLE]
    return [_event(rng, kind, s, resource) for kind, resource in kinds]


def _event(rng: random.Random, kind: str, s: Settings, resource: str | None = None) -> Event:
    duration, param = 0.0, ""
    if kind == "stop":
        duration = s.ttl * rng.uniform(1.2, 2.0)          # longer than the lease
    elif kind == "partition":
        duration = s.ttl * rng.uniform(0.3, 2.0)          # sometimes shorter, mostly longer
    elif kind == "update":
        duration = rng.uniform(1.0, 2.0)
        param = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    elif kind == "drop":
        param = rng.choice(DROPPED)
    elif kind == "kill":
        param = rng.choice(("owner", "owner", "any"))
    elif kind == "pause-before-fence":
        # Resume just after the lease expired, before a standby's next poll took over: the
        # moment when only the database's own clock can tell the fence is late.
        param = f"{rng.uniform(0.0, 0.01):.3f}"
    gap = rng.uniform(0.2, 0.8)
    chosen = rng.choice(s.resources)        # drawn also where it is given: the same sequence
    return Event(gap=gap, kind=kind, resource=resource or chosen, duration=duration,
                 param=param, pick=rng.random())
