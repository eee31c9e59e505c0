"""The fault campaign: real worker processes under real faults, and a checker of the history.

Two fleets: the core's (pgfence's own queue) and the layers' (a pgmq queue worked by Python
PgmqWorkers, a pgflow flow by Deno FlowWorkers in Edge isolates: clients/deno/testdata/
campaign_flow.ts in the stand-in of the Edge Runtime, edge_runtime.ts).

    worker.py      a worker process: pgfence.client Owner and Worker (or PgmqWorker), a fenced
                   handler
    schedule.py    the settings and the seeded schedule of faults
    database.py    the campaign's tables in each schedule's database, a reconnecting connection
    variants.py    the real package and the deliberately broken negative controls
    fleet.py       the supervisor's worker processes and relays
    faults.py      the fault injector
    supervisor.py  one schedule from start to verdict
    checker.py     I1, I2, I5 and progress, from committed data only
    __main__.py    scripts/campaign
    test_campaign.py   the short campaign CI runs

The TCP relay that loses answers or holds all traffic (partitions) is testkit.relay's.
See docs/campaign.md.
"""
