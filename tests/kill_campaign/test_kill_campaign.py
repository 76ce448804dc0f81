"""The kill campaign (tests/kill_campaign) in its quick mode, as CI runs it."""

import json
import subprocess
import sys

import pytest

from tests.helpers.reference import succeeded
from tests.helpers.tiny import REPO_ROOT, pretrain_env


deep = pytest.mark.deep


@deep
def test_kill_campaign_quick(tmp_path):
    """tests/kill_campaign --quick: two trials per command; for convert one, and its publish over another
    shape and links; the token store's build faulted (a worker killed, SIGTERM), and refused
    over a user's file."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.kill_campaign", "--quick", "--out", str(tmp_path / "results")],
        cwd=REPO_ROOT, env=pretrain_env(tmp_path), capture_output=True, text=True, timeout=900,
    )
    succeeded(result)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "kill_campaign" and summary["mode"] == "quick"
    assert summary["commands"] == ["pretrain", "finetune", "convert", "store"], summary["commands"]
    for name, counts in summary["per_command"].items():
        tried = 3 if name == "convert" else 2  # convert: one, a publish of another shape, planted links
        assert counts["tried"] == tried and counts["lost"] == 0 and counts["bit_for_bit"] == tried, (
            name, counts,
        )
        assert f"{name}: {tried} tried, {tried} resumed bit for bit, 0 lost" in result.stdout
    convert = summary["per_command"]["convert"]
    assert (
        convert["shape_trials"] == 1 and convert["link_trials"] == 1 and convert["written_through_links"] == 0
    )
    assert "planted links: 1 trials, 0 written through" in result.stdout
    store = summary["per_command"]["store"]
    assert store["foreign_refused"] == store["foreign_trials"] == 1 and store["left_running"] == 0, store
    assert "a user's file in the store's folder: 1 trials, 1 refused in one line with nothing written" in \
        result.stdout
    assert "0 hung; 0 left a process running; endings: 1 one line, 1 stopped" in result.stdout
    assert (
        "overall: 9 tried, 9 resumed bit for bit, 0 lost; 0 written through a planted link" in result.stdout
    )
    failed = [trial for trial in summary["trials"] if not trial["equal"] or trial["lost"] or trial["error"]]
    assert not failed, json.dumps(failed, indent=1)
    assert all(trial["killed"] for trial in summary["trials"] if trial["stop"] is None), summary["trials"]
    assert summary["signal_trials"] == 3 and summary["stop_promises_kept"] == 3, summary["stops"]
    assert not (tmp_path / "results").exists()  # --quick writes no results
