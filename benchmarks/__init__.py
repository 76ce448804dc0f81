"""Benchmarks: one script per question (run them as `python benchmarks/NAME.py`), each printing a table and a
final JSON line; results in benchmarks/results/. Grouped by question where a question takes several files: the kill
campaign (`python -m benchmarks.kill_campaign`), the seeds' claims (`python -m benchmarks.seed_claims`), the GPU
session (`bash benchmarks/gpu/session.sh OUT_DIR`, its checks in benchmarks/gpu/)."""
