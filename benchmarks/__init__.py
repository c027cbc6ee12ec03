"""Benchmarks of simrun against the physical limit and against the reference design.

`benchmarks/run` runs them all and writes `benchmarks/RESULTS.md`; they are scripts, not tests.
"""
