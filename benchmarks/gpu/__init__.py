"""The GPU session: `bash benchmarks/gpu/session.sh OUT_DIR` (session.sh says what it runs)."""
