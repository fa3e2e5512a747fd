"""snapcache benchmarks: `python -m benchmarks` runs them all (see run_all.py)."""
