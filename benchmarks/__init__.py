"""Benchmarks: each `bench_*.py` measures ratios side by side in one run (see run_all.py)."""
