"""CI stage: the project as a user installs it. Builds the sdist and the wheel (the wheel from the sdist,
as `python -m build` does), checks the wheel's file list, installs the wheel (not editable) into a clean
virtual environment, and from a folder outside the checkout runs `tinytx pretrain` (a short run), loads
the model with AutoModelForCausalLM and AutoTokenizer, then `tinytx interpret`, `tinytx generate`, `tinytx
convert --to llama` and `tinytx finetune` on it, and `tinytx serve` on the fine-tuned folder (the
`serving` extra): a completion and a chat request.

    .venv/bin/python .ci/wheel_check.py [--keep]     # needs `build` (test extra) and pip's index or cache

Standard library only: it runs with the main environment's Python and drives the clean one by subprocess.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the CPU wheel, first: another package's requirement must not pick a CUDA build
# The wheel must hold these besides the code: presets and Accelerate configs, model card templates, the two
# files save_pretrained copies next to the weights, and the command.
REQUIRED = [
    *(
        f"hf_tinytx_training/configs/{name.name}"
        for name in sorted((ROOT / "training" / "configs").iterdir())
    ),
    *(f"hf_tinytx_training/model_cards/{name.name}" for name in sorted((ROOT / "model_cards").glob("*.md"))),
    "hf_tinytx/modeling_tinytx.py",
    "hf_tinytx/configuration_tinytx.py",
    "hf_tinytx_training/cli.py",
]
PACKAGES = ("hf_tinytx", "hf_tinytx_training")  # the only top-level names a wheel of this project may install
# tests/helpers/tiny.py's TINY_PRETRAIN_ARGS with fewer steps and no probes: the
# install, not the model, is checked.
TINY_PRETRAIN = [
    "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2", "--num_attention_heads",
    "4", "--num_train_documents", "300", "--vocab_size", "320", "--block_size", "64",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--num_warmup_steps", "2",
    "--max_eval_batches", "2", "--num_probes_per_kind", "0", "--num_samples", "0", "--max_train_seconds", "0",
    "--max_train_steps", "6",
]
LOAD = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
import hf_tinytx
where = hf_tinytx.__file__
assert "site-packages" in where, f"hf_tinytx came from {where}, not the installed wheel"
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
ids = model.generate(**tokenizer("The animal", return_tensors="pt"), max_new_tokens=5, do_sample=False)
print(type(model).__name__, type(tokenizer).__name__, repr(tokenizer.decode(ids[0])))
"""


def wheel_problems(names: list[str]) -> list[str]:
    """What is wrong with a wheel holding `names`: a top-level name other than the project's (a `training`
    package would collide with other projects), a required file missing, no `tinytx` command."""
    problems = [f"missing {name}" for name in REQUIRED if name not in names]
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    problems += [f"installs a top-level {top!r}; only {', '.join(PACKAGES)} belong to this project"
                 for top in sorted(tops - set(PACKAGES))]
    entry_points = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    if not entry_points:
        problems.append("no entry_points.txt: the `tinytx` command would not be installed")
    return problems


def finetune_records(count: int = 24) -> str:
    """A small jsonl of prompt/response and chat records (so finetune gives the model a chat template),
    enough rows for a few optimizer steps."""
    records = [{"prompt": f"Q: what is {i} plus one?\nA:", "response": f" {i + 1}"} if i % 2 else
               {"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                             {"role": "assistant", "content": f"{i + 1}"}]} for i in range(count)]
    return "".join(json.dumps(record) + "\n" for record in records)


def run(command: list, cwd: Path, env: dict | None = None, timeout: float = 900) -> str:
    """Runs a step, echoing it; a failure ends the stage with the step's own output."""
    print("+", " ".join(map(str, command)), flush=True)
    # No stdin: a question (e.g. whether to trust remote code) fails at once instead of waiting.
    result = subprocess.run(list(map(str, command)), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        sys.exit(f"wheel check: `{command[0]} ...` failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                 f"{result.stderr[-5000:]}")
    return result.stdout


def build(dist: Path) -> tuple[Path, Path]:
    """The sdist, then the wheel built from it (so the sdist is proven complete too)."""
    run([sys.executable, "-m", "build", "--outdir", dist, ROOT], cwd=ROOT)
    (wheel,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    if problems := wheel_problems(names):
        sys.exit("wheel check: the wheel is incomplete: " + "; ".join(problems))
    print(f"{wheel.name}: {len(names)} files; {sdist.name}: {sdist.stat().st_size // 1024} KiB", flush=True)
    return wheel, sdist


def install(wheel: Path, venv: Path) -> Path:
    """A clean environment holding the wheel (not editable) with its `train` and `serving`
    extras; returns its bin/ folder."""
    run([os.environ.get("PYTHON", "python3"), "-m", "venv", venv], cwd=venv.parent)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run([*pip, TORCH], cwd=venv.parent)
    run([*pip, f"{wheel}[train,serving]", TORCH], cwd=venv.parent)
    return venv / "bin"


def user_env(bin_dir: Path, home: Path) -> dict:
    """As in an activated environment, offline, with private caches: nothing from the checkout or ~/.cache."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]), HF_HOME=str(home / "hf_home"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg")
    return env


def use(bin_dir: Path, work: Path) -> None:
    """The commands, from `work` (outside the checkout): pretrain, load,
    interpret, generate, convert, finetune."""
    env, out = user_env(bin_dir, work), work / "out"
    run(["tinytx", "--help"], cwd=work, env=env)
    run(["tinytx", "pretrain", *TINY_PRETRAIN, "--output_dir", out / "tinytx"], cwd=work, env=env)
    print(run(["python", "-c", LOAD, out / "tinytx"], cwd=work, env=env).strip().splitlines()[-1], flush=True)
    run(
        [
            "tinytx", "interpret", out / "tinytx",
            "The animal didn't cross the street because it was tired. The", "--out", work / "maps",
            "--layers", "0",
        ],
        cwd=work,
        env=env,
    )
    if "heads" not in json.loads((work / "maps" / "heads.json").read_text()):
        sys.exit("wheel check: tinytx interpret wrote no head ranking")
    text = run(
        ["tinytx", "generate", out / "tinytx", "The animal didn't", "--max_new_tokens", "8"], cwd=work,
        env=env,
    )
    if not text.startswith("The animal didn't"):
        sys.exit(f"wheel check: tinytx generate printed {text[:200]!r}, not the prompt's continuation")
    run(["tinytx", "convert", "--to", "llama", out / "tinytx", out / "llama"], cwd=work, env=env)
    if json.loads((out / "llama" / "config.json").read_text())["model_type"] != "llama":
        sys.exit("wheel check: tinytx convert --to llama wrote no Llama config")
    (work / "sft.jsonl").write_text(finetune_records())
    run(
        [
            "tinytx", "finetune", "--model_name_or_path", out / "tinytx", "--train_file", work / "sft.jsonl",
            "--output_dir", out / "sft", "--max_steps", "3", "--per_device_train_batch_size", "4",
        ],
        cwd=work,
        env=env,
    )
    if not (out / "sft" / "model.safetensors").is_file():
        sys.exit("wheel check: tinytx finetune left no model.safetensors")


def serve(bin_dir: Path, work: Path, timeout: float = 300) -> None:
    """`tinytx serve out/sft` on a free loopback port until it answers a completion and a chat request."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url, log = f"http://127.0.0.1:{port}", work / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(["tinytx", "serve", "out/sft", "--host", "127.0.0.1", "--port", str(port)],
                                  cwd=work, env=user_env(bin_dir, work), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while not answers(f"{url}/health") and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        for path, body in (("/v1/completions", {"prompt": "The animal"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]})):
            request = urllib.request.Request(
                f"{url}{path}", headers={"Content-Type": "application/json"},
                data=json.dumps({"model": "out/sft", "max_tokens": 4, **body}).encode(),
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                if not json.load(response)["choices"]:
                    sys.exit(f"wheel check: tinytx serve answered {path} with no choices")
        print("tinytx serve answered a completion and a chat request", flush=True)
    except OSError as error:
        sys.exit(
            f"wheel check: tinytx serve did not answer ({error}):\n{log.read_text(errors='replace')[-3000:]}"
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (printed) for a look")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tinytx-wheel-"))
    start = time.monotonic()
    try:
        wheel, _ = build(work / "dist")
        bin_dir = install(wheel, work / "venv")
        (work / "user").mkdir()
        use(bin_dir, work / "user")
        serve(bin_dir, work / "user")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wheel check passed in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
