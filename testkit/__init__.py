"""pgfence's test kit: throwaway clusters and PgBouncer (``cluster``), named sessions and steps
for interleaving tests (``harness``), and every interleaving of a bounded scenario
(``permutations``). The tests, the fault campaign, the benchmarks, the demo's scripts and the
mutation tool import it; the wheel does not ship it, and nothing users import depends on it.
"""
