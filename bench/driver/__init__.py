"""The benchmark driver (scripts/bench; its usage is in __main__.py, its findings in
docs/performance.md).

    run.py         options, the cluster under test, pgbench runs, the driver's child processes
    pairs.py       the pairs: a pgfence operation against a baseline doing its work unfenced
    properties.py  the properties over time: renewals, takeover latency, claim with history
    report.py      the report's environment section and number formats
    __main__.py    arguments, the run, the report
"""
