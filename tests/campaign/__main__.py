"""scripts/campaign: runs N seeded schedules on a throwaway cluster and prints the figures.

    scripts/campaign --schedules 20 --seed 1                 the real package
    scripts/campaign --schedules 2 --seed 1 --variant controls   each negative control
    scripts/campaign --variant real,no-lock --schedules 3 --seed 7 --verbose
    scripts/campaign --fleet layers --schedules 5 --seed 1   the layers' fleet (pgmq, pgflow)

Schedule i of seed S is seeded with "S:i", whatever the variant: the controls meet the same
faults as the real package. Exit status 1 when the real package shows a violation, or a
negative control shows none (a checker that never fails proves nothing).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

from testkit.cluster import Cluster
from tests.pgflow14 import CRON_SETTINGS, missing

from .schedule import Settings, layer_settings, make_schedule
from .supervisor import Campaign, Outcome
from .variants import VARIANTS, controls

INVARIANTS = ("I1", "I2", "I5", "progress")


def counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items())) or "none"


def line(o: Outcome) -> str:
    f = o.figures
    missed = f"; missed: {counts(o.missed)}" if o.missed else ""
    return (f"  {o.variant} {o.seed}: {o.seconds:.0f}s, faults {sum(o.applied.values())} "
            f"({counts(o.applied)}{missed}), tasks {f['tasks']}, writes {f['writes']}, "
            f"leases {f['leases']}, stale results {f['stale results']}, "
            f"violations {len(o.violations)}")


def total(variant: str, outcomes: list[Outcome]) -> str:
    applied: Counter[str] = sum((o.applied for o in outcomes), Counter())
    missed: Counter[str] = sum((o.missed for o in outcomes), Counter())
    found: Counter[str] = sum((o.by_invariant() for o in outcomes), Counter())
    fig = {k: sum(o.figures[k] for o in outcomes) for k in outcomes[0].figures}
    return (f"{variant}: {len(outcomes)} schedules, {sum(o.seconds for o in outcomes):.0f}s\n"
            f"  faults applied {sum(applied.values())}: {counts(applied)}\n"
            f"  faults missed {sum(missed.values())}: {counts(missed)}\n"
            f"  tasks {fig['tasks']}, claims {fig['claims']}, writes {fig['writes']}, "
            f"leases {fig['leases']}, stale results {fig['stale results']}\n"
            f"  violations {sum(found.values())}: "
            + ", ".join(f"{i} {found[i]}" for i in INVARIANTS))


def main() -> int:
    p = argparse.ArgumentParser(prog="scripts/campaign", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", type=int, default=1)
    p.add_argument("--seed", default="1")
    p.add_argument("--fleet", choices=("core", "layers"), default="core",
                   help="what the workers work: pgfence's queue, or the layers' (pgmq and "
                        "pgflow, Python and Deno workers)")
    p.add_argument("--pgflow", choices=("0.14.1", "0.8.1"),
                   help="the layers' pgflow (default: 0.14.1 where pg_cron and its vendored "
                        "migrations are here, else 0.8.1)")
    p.add_argument("--variant", default="real",
                   help=f"comma-separated: {', '.join(VARIANTS)}; 'controls' or 'all' "
                        "(of the fleet)")
    p.add_argument("--random-faults", type=int, default=Settings.random_faults,
                   help="faults per schedule beside the ones every schedule has")
    p.add_argument("--logs", type=Path, help="keep the worker and supervisor logs here")
    p.add_argument("--verbose", action="store_true", help="print every fault as it is applied")
    p.add_argument("--show-schedule", action="store_true",
                   help="print the schedules and exit (no cluster)")
    args = p.parse_args()
    names = {"controls": list(controls(args.fleet)),
             "all": ["real", *controls(args.fleet)]}.get(args.variant, args.variant.split(","))
    unknown = [n for n in names if n not in VARIANTS or args.fleet not in VARIANTS[n].fleets]
    if unknown:
        p.error(f"unknown variant of the {args.fleet} fleet: {', '.join(unknown)}")
    s = replace(Settings() if args.fleet == "core" else layer_settings(),
                random_faults=args.random_faults)
    if args.fleet == "layers":
        why = missing()
        if args.pgflow == "0.14.1" and why:
            p.error(why)
        s = replace(s, pgflow=args.pgflow or ("0.8.1" if why else "0.14.1"))
    seeds = [f"{args.seed}:{i}" for i in range(1, args.schedules + 1)]
    if args.show_schedule:
        for seed in seeds:
            print(f"schedule {seed}:")
            for ev in make_schedule(seed, s):
                print(f"  {ev}")
        return 0

    logs = args.logs or Path(tempfile.mkdtemp(prefix="pgfence-campaign."))
    say = (lambda text: print(f"    {text}", flush=True)) if args.verbose else (lambda _: None)
    failed = False
    cron = CRON_SETTINGS if s.fleet == "layers" and s.pgflow == "0.14.1" else ()
    with Cluster.start(["fsync=off", *cron]) as cluster:
        campaign = Campaign(cluster, s, logs, say)
        results: dict[str, list[Outcome]] = {}
        for name in names:
            pgflow = f" (pgflow {s.pgflow})" if s.fleet == "layers" else ""
            print(f"{name}, {s.fleet} fleet{pgflow}: {VARIANTS[name].summary}", flush=True)
            for seed in seeds:
                outcome = campaign.run(VARIANTS[name], seed)
                results.setdefault(name, []).append(outcome)
                print(line(outcome), flush=True)
                for invariant in INVARIANTS:          # the first two of each kind
                    for v in [v for v in outcome.violations if v.invariant == invariant][:2]:
                        print(f"    {v}", flush=True)
    print()
    for name, outcomes in results.items():
        print(total(name, outcomes))
        found = sum(len(o.violations) for o in outcomes)
        if (name == "real") == (found > 0):
            failed = True
            why = "violations in the real package" if found else "the control found nothing"
            print(f"  FAILED: {why}")
    if failed or args.logs:
        print(f"logs: {logs}")
    else:
        shutil.rmtree(logs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
