"""The process helpers that tests/test_serve_limits.py and tests/kill_campaign/nodes_trials.py import from here; they
live in tests/helpers/processes.py. The stand-ins for `srun` and `scontrol` this module held are gone: the SLURM
recipe is tested on a real SLURM (tests/helpers/slurm_cluster.py, tests/test_slurm.py)."""

from tests.helpers.processes import alive, descendants, workers_under


__all__ = ["alive", "descendants", "workers_under"]
