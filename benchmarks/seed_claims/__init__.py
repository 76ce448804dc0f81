"""The seeds' claims, measured: `python -m benchmarks.seed_claims` (run from the checkout's root; __main__.py
says what each claim is). Claims 1 and 2 reuse benchmarks.attention_scaling and benchmarks.common."""
