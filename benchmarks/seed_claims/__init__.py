"""The seeds' claims, measured: `python -m benchmarks.seed_claims` (run from the checkout's root; __main__.py says
what each claim is). Claims 1 and 2 reuse two scripts of benchmarks/, attention_scaling.py and common.py, which import
their own siblings by plain name as a script run from benchmarks/ does: that folder goes on the path first."""

import sys
from pathlib import Path


_BENCHMARKS = str(Path(__file__).resolve().parents[1])
if _BENCHMARKS not in sys.path:
    sys.path.insert(0, _BENCHMARKS)
