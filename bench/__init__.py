"""The benchmark suite: ``python -m bench`` measures skiplock against a pgbench baseline from the same run.

Every scenario runs on the same PostgreSQL server as the baseline, in a database of its own, and
every figure is reported as a ratio to that baseline (or to an absolute target), because this kind
of machine (two cores, shared with other people's test runs) makes absolute numbers noisy.
See docs/benchmarks.md for the figures of a real run and how to read them.
"""
