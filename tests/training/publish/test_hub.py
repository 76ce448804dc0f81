"""Pushing to the Hub (training/publish/hub.py, pretrain.py --push_to_hub) against a local Hub server
(tests/helpers/hub_server.py). `huggingface_hub` reads `HF_ENDPOINT` when first imported, so everything that
talks to the server runs in a subprocess whose environment points at it, with a fresh `HF_HOME`."""

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, load_file

from tests.helpers.remote_code import BLOCK_HF_TINYTX
from tests.helpers.tiny import assert_same_weights, pretrain_env
from tests.training.test_pretrain_recipe import rows


def client_env(hub, home: Path, token="default") -> dict:
    """os.environ without any Hub settings of the machine, plus the server's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_"))}
    env.pop("PYTHONPATH", None)
    env.update(hub.client_env(home, token=token))
    return env


def run_python(*code_parts: str, env: dict, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    code = "\n".join(textwrap.dedent(part) for part in code_parts)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"subprocess failed:\nSTDOUT:\n{result.stdout}\nSTDERR:\n{result.stderr}"
    return result


def last_json_line(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def assert_token_nowhere(token: str, roots, outputs) -> None:
    """The token is in none of the files under `roots` and none of the captured outputs."""
    needle = token.encode()
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert needle not in path.read_bytes(), f"token written to {path}"
    for text in outputs:
        assert token not in text, "token in captured output"


@pytest.fixture
def work(tmp_path):
    """A working folder outside the repository, with a fresh HF_HOME and a folder to push."""
    (tmp_path / "cwd").mkdir()
    folder = tmp_path / "cwd" / "checkpoint-1"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(os.urandom(4096))
    (folder / "notes").mkdir()
    (folder / "notes" / "step.txt").write_text("step 1\n")
    return tmp_path


PUSHER_PRELUDE = """
import json, logging, os, sys, time
# as chatty as possible: logs must stay token-free
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from hf_tinytx_training.publish.hub import HubPusher
"""


def test_pushed_model_loads_by_repo_id_without_the_package(local_hub, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    model_dir, home = cwd / "tiny-model", tmp_path / "hf_home"
    repo_id = f"{local_hub.user}/tinytx-roundtrip"

    push = run_python(
        PUSHER_PRELUDE,
        f"""
        import torch
        from safetensors.torch import save_file
        from hf_tinytx import TinyTxConfig, TinyTxForCausalLM

        torch.manual_seed(0)
        config = TinyTxConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        model = TinyTxForCausalLM(config).eval()
        model.save_pretrained({str(model_dir)!r})
        input_ids = torch.randint(0, config.vocab_size, (2, 11))
        with torch.no_grad():
            logits = model(input_ids).logits
        save_file({{"input_ids": input_ids, "logits": logits}}, {str(tmp_path / "original.safetensors")!r})

        pusher = HubPusher({repo_id!r}, private=True)
        pusher.push_async({str(model_dir)!r}, "checkpoint", path_in_repo="checkpoints/step-1")
        ok = pusher.push({str(model_dir)!r}, "final model")  # queued after the checkpoint, so committed last
        print(json.dumps({{"ok": ok, "failures": pusher.failures}}))
        """,
        env=client_env(local_hub, home),
        cwd=cwd,
    )
    assert last_json_line(push.stdout) == {"ok": True, "failures": []}

    files = local_hub.repo_files(repo_id)
    for name in ("config.json", "model.safetensors", "modeling_tinytx.py", "configuration_tinytx.py"):
        assert files[name] == (model_dir / name).read_bytes()
        assert files[f"checkpoints/step-1/{name}"] == (model_dir / name).read_bytes()
    assert [c.message for c in local_hub.commits(repo_id)][:2] == ["final model", "checkpoint"]
    assert local_hub.repo_is_private(repo_id) is True

    # A fresh process, cache and working folder, where hf_tinytx cannot be
    # imported: only the Hub has the code.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    load = run_python(
        BLOCK_HF_TINYTX,
        f"""
        import json
        import torch
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        original = load_file({str(tmp_path / "original.safetensors")!r})
        model = AutoModelForCausalLM.from_pretrained({repo_id!r}, trust_remote_code=True).eval()
        with torch.no_grad():
            logits = model(original["input_ids"]).logits
        print(json.dumps({{
            "identical": torch.equal(logits, original["logits"]),
            "class_module": type(model).__module__,
            "package_imported": any(m.split(".")[0] == "hf_tinytx" for m in sys.modules),
        }}))
        """,
        env=client_env(local_hub, tmp_path / "fresh_hf_home"),
        cwd=elsewhere,
    )
    report = last_json_line(load.stdout)
    assert report["identical"] is True
    assert report["package_imported"] is False
    assert report["class_module"].endswith("modeling_tinytx") and not report["class_module"].startswith(
        "hf_tinytx"
    )
    assert local_hub.recorded("HEAD", f"/{repo_id}/resolve/"), "the model was not fetched from the local Hub"
    assert_token_nowhere(local_hub.token, [tmp_path], [push.stdout, push.stderr, load.stdout, load.stderr])


@pytest.mark.deep
def test_failing_hub_never_blocks_or_breaks_training(local_hub, work):
    # every commit fails; Retry-After 0 keeps this short
    local_hub.fail_commits(None, status=503, retry_after=0)
    repo_id = f"{local_hub.user}/always-down"
    folder = work / "cwd" / "checkpoint-1"

    result = run_python(
        PUSHER_PRELUDE,
        f"""
        pusher = HubPusher({repo_id!r}, max_attempts=2, retry_wait_s=0.1)
        start = time.monotonic()
        pusher.push_async({str(folder)!r}, "checkpoint 1")
        returned_after = time.monotonic() - start
        steps = 0
        while time.monotonic() - start < 0.5:  # "training" goes on while the push fails in the background
            steps += 1
        finished = pusher.wait(timeout=120)
        print(json.dumps({{"returned_after": returned_after, "steps": steps, "finished": finished,
                          "failures": pusher.failures}}))
        """,
        env=client_env(local_hub, work / "hf_home"),
        cwd=work / "cwd",
    )
    report = last_json_line(result.stdout)
    assert report["returned_after"] < 0.5
    assert report["steps"] > 0 and report["finished"] is True
    assert len(report["failures"]) == 1 and "checkpoint 1" in report["failures"][0]
    assert "503" in report["failures"][0]
    # Bounded retries: each of the pusher's 2 attempts is one upload_folder, which tries the commit 6 times.
    assert len(local_hub.recorded("POST", f"/api/models/{repo_id}/commit/")) == 2 * 6
    assert set(local_hub.repo_files(repo_id)) == {".gitattributes"}  # nothing but the repo's initial commit
    assert sorted(p.name for p in (work / "cwd").iterdir()) == ["checkpoint-1"]  # the snapshot was cleaned up
    assert_token_nowhere(local_hub.token, [work], [result.stdout, result.stderr])


def test_token_stays_out_of_files_logs_and_errors(local_hub, work):
    # A careless server that echoes the Authorization header in its error messages, failing the first
    # upload_folder (6 commit tries); the pusher's second attempt gets through.
    local_hub.echo_auth_in_errors = True
    local_hub.fail_commits(6, status=500, retry_after=0)
    repo_id = f"{local_hub.user}/token-hygiene"
    folder = work / "cwd" / "checkpoint-1"
    env = client_env(local_hub, work / "hf_home", token=None)
    env["PUSH_TOKEN"] = local_hub.token  # passed explicitly (token=...), not through HF_TOKEN this time

    result = run_python(
        PUSHER_PRELUDE,
        f"""
        pusher = HubPusher({repo_id!r}, token=os.environ.pop("PUSH_TOKEN"), max_attempts=2, retry_wait_s=0.1)
        print(repr(pusher), vars(pusher).keys())
        pusher.push_async({str(folder)!r}, "checkpoint 1")
        pusher.wait()
        print(json.dumps({{"failures": pusher.failures}}))
        """,
        env=env,
        cwd=work / "cwd",
    )
    assert last_json_line(result.stdout) == {"failures": []}
    assert "failed (attempt 1 of 2)" in result.stderr  # the echoed header went through the scrubbed warning
    assert local_hub.repo_files(repo_id)["notes/step.txt"] == b"step 1\n"
    sent = local_hub.recorded("POST", "/commit/")
    assert sent and all(r.headers.get("authorization") == f"Bearer {local_hub.token}" for r in sent)
    assert_token_nowhere(local_hub.token, [work], [result.stdout, result.stderr])


def test_wrong_token_is_a_clear_failure_not_a_crash(local_hub, work):
    local_hub.echo_auth_in_errors = True  # the wrong token comes back in the error text: it must be scrubbed
    wrong_token = "hf_wrong" + "x" * 30
    repo_id = f"{local_hub.user}/wrong-token"

    result = run_python(
        PUSHER_PRELUDE,
        f"""
        pusher = HubPusher({repo_id!r}, max_attempts=3, retry_wait_s=5)
        pusher.push_async({str(work / "cwd" / "checkpoint-1")!r}, "checkpoint 1")
        final_ok = pusher.push({str(work / "cwd" / "checkpoint-1")!r}, "final model")
        print(json.dumps({{"final_ok": final_ok, "failures": pusher.failures}}))
        """,
        env=client_env(local_hub, work / "hf_home", token=wrong_token),
        cwd=work / "cwd",
        timeout=60,
    )
    report = last_json_line(result.stdout)
    assert report["final_ok"] is False
    assert len(report["failures"]) == 2
    assert all("401" in message and "token" in message for message in report["failures"])
    # A 401 is not retried (retry_wait_s=5 would have shown up as slowness): one create_repo try per push.
    assert len(local_hub.recorded("POST", "/api/repos/create")) == 2
    assert local_hub.repo_is_private(repo_id) is None  # never created
    assert_token_nowhere(wrong_token, [work], [result.stdout, result.stderr])


def test_push_async_of_a_missing_folder_is_reported_not_raised(tmp_path, monkeypatch):
    from hf_tinytx_training.publish import hub

    pusher = hub.HubPusher("tester/never-reached", token="hf_" + "z" * 30)
    pusher.push_async(str(tmp_path / "no-such-checkpoint"), "checkpoint 9")
    assert pusher.wait(timeout=5) is True
    assert len(pusher.failures) == 1 and "checkpoint 9" in pusher.failures[0]
    assert "z" * 30 not in repr(pusher)


def test_a_final_push_removes_the_snapshot_a_killed_push_left(tmp_path):
    """A killed push's hard-linked snapshot (.hub-final-*) was once kept for good.
    This pusher records what it gets."""
    import threading
    from types import SimpleNamespace

    from hf_tinytx_training.publish import hub

    folder = tmp_path / "model"
    (folder / ".hub-final-k1ll3d").mkdir(parents=True)
    (folder / ".hub-final-k1ll3d" / "model.safetensors").write_bytes(b"the killed push's copy")
    (folder / "model.safetensors").write_bytes(b"the model")
    submitted = []

    def submit(snapshot, message):
        submitted.append(sorted(os.listdir(snapshot)))
        done = threading.Event()
        done.set()
        return SimpleNamespace(done=done, ok=True)

    pusher = SimpleNamespace(
        repo_id="tester/model", failures=[], wait=lambda timeout, stop: True, submit=submit,
        note_unfinished=lambda *args: None,
    )
    stop = SimpleNamespace(received=None, program="finetune.py")
    assert hub.push_final(pusher, str(folder), ["model.safetensors"], "final", "model", 60, (), stop,
                          say=lambda line: None) is None
    assert submitted == [["model.safetensors"]]
    assert sorted(os.listdir(folder)) == ["model.safetensors"]


# -------------------------------------------------------------------------------------------
# the server by itself


def _request(hub, method, path, body=None, token=None, headers=None):
    request = urllib.request.Request(hub.url + path, data=body, method=method, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _commit_body(message, files=(), deleted=()):
    lines = [{"key": "header", "value": {"summary": message, "description": ""}}]
    lines += [
        {"key": "file", "value": {"path": p, "content": base64.b64encode(c).decode(), "encoding": "base64"}}
        for p, c in files
    ]
    lines += [{"key": "deletedFile", "value": {"path": p}} for p in deleted]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_server_history_auth_and_errors(local_hub):
    create = json.dumps({"name": "raw", "organization": local_hub.user}).encode()
    assert _request(local_hub, "POST", "/api/repos/create", create)[0] == 401
    assert _request(local_hub, "POST", "/api/repos/create", create, token="hf_not_the_one")[0] == 401
    assert _request(local_hub, "POST", "/api/repos/create", create, token=local_hub.token)[0] == 200
    status, _, body = _request(local_hub, "POST", "/api/repos/create", create, token=local_hub.token)
    assert status == 409 and json.loads(body)["url"].endswith(f"/{local_hub.user}/raw")

    commit_path = f"/api/models/{local_hub.user}/raw/commit/main"
    content = os.urandom(100)
    assert _request(local_hub, "POST", commit_path, _commit_body("anonymous", [("a.bin", content)]))[0] == 401
    status, _, body = _request(local_hub, "POST", commit_path, _commit_body("add", [("a.bin", content)]),
                               token=local_hub.token)
    first = json.loads(body)["commitOid"]
    assert status == 200 and len(first) == 40 and int(first, 16) >= 0
    _request(local_hub, "POST", commit_path, _commit_body("remove", deleted=["a.bin"]), token=local_hub.token)

    assert [c.message for c in local_hub.commits(f"{local_hub.user}/raw")] == [
        "remove", "add", "initial commit",
    ]
    assert "a.bin" not in local_hub.repo_files(f"{local_hub.user}/raw")
    assert local_hub.repo_files(f"{local_hub.user}/raw", revision=first)["a.bin"] == content

    # Downloads pinned to the old commit still work and carry what the client checks.
    status, headers, _ = _request(local_hub, "HEAD", f"/{local_hub.user}/raw/resolve/{first}/a.bin")
    assert (
        status == 200 and headers["X-Repo-Commit"] == first and int(headers["Content-Length"]) == len(content)
    )
    if shutil.which("git"):  # the ETag is git's own blob id for the content
        git_id = subprocess.run(["git", "hash-object", "--stdin"], input=content, capture_output=True).stdout
        assert headers["ETag"].strip('"') == git_id.decode().strip()
    for path, code in [
        (f"/{local_hub.user}/raw/resolve/main/a.bin", "EntryNotFound"),
        (f"/{local_hub.user}/raw/resolve/no-branch/a.bin", "RevisionNotFound"),
        (f"/{local_hub.user}/nothing/resolve/main/a.bin", "RepoNotFound"),
    ]:
        status, headers, _ = _request(local_hub, "HEAD", path)
        assert (status, headers.get("X-Error-Code")) == (404, code)

    private = json.dumps({"name": "secret", "organization": local_hub.user, "visibility": "private"}).encode()
    assert _request(local_hub, "POST", "/api/repos/create", private, token=local_hub.token)[0] == 200
    status, headers, _ = _request(local_hub, "HEAD", f"/{local_hub.user}/secret/resolve/main/.gitattributes")
    assert (status, headers.get("X-Error-Code")) == (401, "RepoNotFound")
    status, _, _ = _request(local_hub, "HEAD", f"/{local_hub.user}/secret/resolve/main/.gitattributes",
                            token=local_hub.token)
    assert status == 200

    local_hub.fail_commits(1, status=500)
    failing = _commit_body("flaky", [("b.txt", b"b")])
    assert _request(local_hub, "POST", commit_path, failing, token=local_hub.token)[0] == 500
    assert _request(local_hub, "POST", commit_path, failing, token=local_hub.token)[0] == 200
    assert all(r.status is not None for r in local_hub.requests)



LFS_ROUND_TRIP = """
from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download
api = HfApi()
api.create_repo("tester/lfs", private=True)
adds = [CommitOperationAdd("big.bin", big), CommitOperationAdd("s.txt", b"s")]
api.create_commit("tester/lfs", operations=adds, commit_message="one of each")
print(open(hf_hub_download("tester/lfs", "big.bin"), "rb").read() == open(big, "rb").read())
"""


def test_large_files_go_up_by_lfs_and_a_throttled_server_serves_them_slowly(tmp_path):
    """From `lfs_from` bytes a file goes up as the Hub takes it (LFS batch, then its raw bytes PUT, then
    verify) and comes back whole; a throttled server takes its time over a file's body."""
    from tests.helpers.hub_server import LocalHub

    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(60_000))
    with LocalHub(lfs_from=1000) as hub:
        hub.throttle(200_000)
        env = {**client_env(hub, tmp_path / "hf_home"), **hub.client_env(tmp_path / "hf_home", lfs=True)}
        done = run_python(f"big = {str(big)!r}", LFS_ROUND_TRIP, env=env, cwd=tmp_path)
        assert done.stdout.split()[-1] == "True", done.stdout
        assert hub.repo_files("tester/lfs")["big.bin"] == big.read_bytes()
        put = hub.recorded("PUT", "/lfs-objects/")
        assert len(put) == 1 and put[0].received == 60_000 and put[0].status == 200
        (commit,) = hub.recorded("POST", "/commit/")
        assert commit.status == 200 and commit.received < 1000  # the small file inline, the large one by name
        assert hub.recorded("POST", "/info/lfs/objects/batch")[0].status == 200
        (got,) = [r for r in hub.recorded("GET", "/resolve/") if r.path.endswith("/big.bin")]
        assert got.served == 60_000 and got.finished - got.started > 0.25  # 0.3 s at 200 kB/s


# ------------------------------------------------------------------------------ pretrain.py --push_to_hub

STEPS, EVERY = 4, 2  # checkpoints at steps 2 and 4
FAST_RUN = ["--max_train_steps", STEPS, "--checkpointing_steps", EVERY, "--eval_steps", 100,
            "--num_probes_per_kind", 0, "--num_samples", 0]
MODEL_REPO_FILES = {
    "config.json", "model.safetensors", "generation_config.json", "configuration_tinytx.py",
    "modeling_tinytx.py", "tokenizer.json", "tokenizer_config.json", "README.md",
}
PICKLE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth", ".ckpt")


def pretrain_hub_env(local_hub, tmp_path, token="default"):
    """pretrain_env (offline datasets, own caches), but with the Hub pointed at the local server."""
    env = {
        k: v for k, v in pretrain_env(tmp_path).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))
    }
    env.update(local_hub.client_env(tmp_path / "hf_home", token=token))
    return env


def test_checkpoints_and_final_model_reach_the_hub_and_load_by_repo_id(local_hub, run_pretrain, tmp_path):
    repo_id = f"{local_hub.user}/tiny"
    output_dir = tmp_path / "model"
    env = pretrain_hub_env(local_hub, tmp_path, token=None)  # no HF_TOKEN: the token `hf auth login` stored
    login = tmp_path / "hf_home" / "token"
    login.parent.mkdir(parents=True, exist_ok=True)
    login.write_text(local_hub.token)
    result = run_pretrain(
        "--output_dir", output_dir, *FAST_RUN, "--push_to_hub", "--hub_model_id", repo_id, env=env
    )
    assert f"Pushed the final model to the Hub as {repo_id}" in result.stdout
    login.unlink()  # the user's own login file; no other file may hold the token (checked at the end)

    files = local_hub.repo_files(repo_id)
    assert MODEL_REPO_FILES <= set(files), MODEL_REPO_FILES - set(files)
    for name in MODEL_REPO_FILES:  # the root is the final local folder, byte for byte
        assert files[name] == (output_dir / name).read_bytes(), name
    checkpoint_steps = range(EVERY, STEPS + 1, EVERY)
    for step in checkpoint_steps:
        prefix = f"checkpoints/step_{step}/"
        assert {prefix + name for name in MODEL_REPO_FILES} <= set(files)
        # The checkpoint's weights are those of the resumable local checkpoint at that step.
        pushed = load(files[prefix + "model.safetensors"])
        saved = load_file(output_dir / "checkpoints" / f"step_{step}" / "model.safetensors")
        assert set(pushed) == set(saved) and all(torch.equal(pushed[k], saved[k]) for k in pushed)
    # Only model repos: no optimizer, scheduler or RNG state, no trainer state, no other checkpoint files.
    assert not [path for path in files if path.endswith(PICKLE_SUFFIXES) or "trainer_state" in path]
    assert {path.split("/")[1] for path in files if path.startswith("checkpoints/")} == {
        f"step_{step}" for step in checkpoint_steps}
    # Checkpoints in order while training ran, the final model last.
    messages = [commit.message for commit in local_hub.commits(repo_id)]
    assert messages[:-1] == [f"TinyTx pre-trained for {STEPS} steps",
                             *(f"Checkpoint at step {step}" for step in reversed(checkpoint_steps))]
    # The hub exports and the pusher's snapshots are gone; the resumable checkpoints are still there.
    leftovers = [p for p in output_dir.rglob(".hub*")]
    assert not leftovers and (output_dir / "checkpoints" / f"step_{STEPS}" / "optimizer.bin").is_file()

    # A fresh process, cache and folder, without the package: the repo id alone must give the same model.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    load_run = run_python(
        BLOCK_HF_TINYTX,
        f"""
        import json, torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        hub = AutoModelForCausalLM.from_pretrained({repo_id!r}, trust_remote_code=True).eval()
        local = AutoModelForCausalLM.from_pretrained({str(output_dir)!r}, trust_remote_code=True).eval()
        checkpoint = AutoModelForCausalLM.from_pretrained(
            {repo_id!r}, subfolder="checkpoints/step_{EVERY}", trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({repo_id!r}, trust_remote_code=True)
        text = "The dog didn't cross the street because it was too"
        input_ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = hub(input_ids).logits
            print(json.dumps({{
                "identical": torch.equal(logits, local(input_ids).logits),
                "checkpoint_finite": bool(torch.isfinite(checkpoint(input_ids).logits).all()),
                "module": type(hub).__module__,
                "package_imported": any(m.split(".")[0] == "hf_tinytx" for m in sys.modules),
            }}))
        """,
        env=client_env(local_hub, tmp_path / "fresh_hf_home"),
        cwd=elsewhere,
    )
    report = last_json_line(load_run.stdout)
    assert report["identical"] is True and report["checkpoint_finite"] is True
    assert report["package_imported"] is False and report["module"].startswith("transformers_modules")
    assert local_hub.recorded("GET", f"/{repo_id}/resolve/"), "the model did not come from the local Hub"
    assert_token_nowhere(local_hub.token, [tmp_path],
                         [result.stdout, result.stderr, load_run.stdout, load_run.stderr])


@pytest.mark.deep
def test_failing_hub_does_not_fail_training_or_the_local_folder(local_hub, run_pretrain, tmp_path):
    # Every commit is refused with a 4xx, which neither the client nor the pusher retries, so this stays fast.
    local_hub.fail_commits(None, status=422)
    repo_id = f"{local_hub.user}/tiny-down"
    output_dir = tmp_path / "model"
    env = pretrain_hub_env(local_hub, tmp_path, token=None)  # this time the token comes from --hub_token
    result = run_pretrain("--output_dir", output_dir, *FAST_RUN, "--push_to_hub", "--hub_model_id", repo_id,
                          "--hub_token", local_hub.token, "--hub_private_repo", env=env, check=False)

    assert result.returncode == 1  # a push asked for that did not happen: as finetune.py
    warnings = [
        line for line in result.stderr.splitlines() if "--hub_token puts the token on the command" in line
    ]
    assert len(warnings) == 1 and "HF_TOKEN" in warnings[0] and "hf auth login" in warnings[0], result.stderr[
        -3000:
    ]
    assert (
        "pretrain.py: error: The final model was NOT pushed" in result.stderr and "hf upload" in result.stderr
    )
    for name in ("Checkpoint at step 2", f"TinyTx pre-trained for {STEPS} steps"):
        assert any(name in line and "422" in line for line in result.stdout.splitlines()), name
    assert set(local_hub.repo_files(repo_id)) == {".gitattributes"}  # created, but no commit went through
    assert local_hub.repo_is_private(repo_id) is True  # --hub_private_repo
    assert local_hub.recorded("POST", f"/api/models/{repo_id}/commit/"), "the pushes never reached the Hub"

    assert MODEL_REPO_FILES <= set(os.listdir(output_dir))
    from transformers import AutoModelForCausalLM

    import hf_tinytx  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(output_dir)
    assert torch.isfinite(model(torch.tensor([[1, 5, 9]])).logits).all()
    assert not list(output_dir.rglob(".hub*"))
    assert_token_nowhere(local_hub.token, [tmp_path], [result.stdout, result.stderr])


# Two configurations, as a dataset card declares them: so a run must name one (--dataset_config_name).
DATASET_CARD = """---
configs:
- config_name: tiny
  data_files:
  - {split: train, path: train.jsonl}
  - {split: validation, path: validation.jsonl}
- config_name: other
  data_files:
  - {split: train, path: other/train.jsonl}
---
"""


def upload_text_dataset(local_hub, tmp_path, repo_id: str) -> Path:
    """A dataset repo of two configurations, "tiny" (train.jsonl,
    validation.jsonl) and "other"; its local copy."""
    from hf_tinytx.corpus import default_corpus

    folder = tmp_path / "dataset"
    (folder / "other").mkdir(parents=True)
    for split, documents in default_corpus(num_documents=300, seed=0).items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": doc}) + "\n" for doc in documents))
    (folder / "other" / "train.jsonl").write_text(json.dumps({"text": "another dataset altogether"}) + "\n")
    (folder / "README.md").write_text(DATASET_CARD)
    run_python(f"from huggingface_hub import HfApi; api = HfApi(); "
               f"api.create_repo({repo_id!r}, repo_type='dataset'); "
               f"api.upload_folder(folder_path={str(folder)!r}, repo_id={repo_id!r}, repo_type='dataset')",
               env=pretrain_hub_env(local_hub, tmp_path / "uploader"), cwd=tmp_path)
    return folder


@pytest.mark.deep
def test_a_hub_dataset_trains_the_same_model_as_its_files_read_locally(local_hub, run_pretrain, tmp_path):
    repo_id = f"{local_hub.user}/tiny-text"
    folder = upload_text_dataset(local_hub, tmp_path, repo_id)
    flags = ["--max_train_steps", 4, "--num_probes_per_kind", 0, "--num_samples", 0]
    env = {**pretrain_hub_env(local_hub, tmp_path), "HF_DATASETS_OFFLINE": "0"}
    hub = run_pretrain(
        "--output_dir", tmp_path / "hub", "--dataset_name", repo_id, "--dataset_config_name", "tiny", *flags,
        env=env,
    )
    local = run_pretrain("--output_dir", tmp_path / "local", "--train_file", folder / "train.jsonl",
                         "--validation_file", folder / "validation.jsonl", *flags)
    assert local_hub.recorded("GET", f"/datasets/{repo_id}/resolve/"), "the run did not download the dataset"
    def blocks(result):
        return next(line for line in result.stdout.splitlines() if "training and" in line)

    assert blocks(hub) == blocks(local)
    assert_same_weights(tmp_path / "hub", tmp_path / "local")
    assert f"the Hub dataset `{repo_id}`" in (tmp_path / "hub" / "README.md").read_text()

    # --streaming reads the same repo as a stream; its validation split (streamed too) is read into memory for
    # the evaluations (once failed: an IterableDataset has no set_format).
    streamed = run_pretrain(
        "--output_dir", tmp_path / "streamed", "--dataset_name", repo_id, "--dataset_config_name", "tiny",
        "--streaming", *flags, env=env,
    )
    assert "Training for 4 steps" in streamed.stdout
    assert [r["step"] for r in rows(tmp_path / "streamed") if "loss" in r] == [1, 2, 3, 4]
    assert [r for r in rows(tmp_path / "streamed") if r.get("final") and "eval_loss" in r]
