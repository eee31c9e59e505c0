"""The fault campaign: real worker processes under real faults, and a checker of the history.

    worker.py      a worker process: pgfence.client Owner and Worker, a fenced handler
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
