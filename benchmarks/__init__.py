"""Benchmarks: one module per question, run from the checkout's root as `python -m benchmarks.NAME`, each
printing a table and a final JSON line; results in benchmarks/results/. A question that takes several files is
a package: the seeds' claims (`python -m benchmarks.seed_claims`) and the GPU session (`bash
benchmarks/gpu/session.sh OUT_DIR`). The kill campaign is a fault harness, so it lives with the tests that
drive it (`python -m tests.kill_campaign`)."""
