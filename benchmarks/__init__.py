"""Benchmarks: one script per question (run them as `python benchmarks/NAME.py`), each printing a table and a
final JSON line; results in benchmarks/results/."""
