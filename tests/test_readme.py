"""README.md and the docs/ pages as a new user follows them: every code block run as pasted, in order, in one
fresh working folder; then the "How to use" snippets of a trained model's card, run from another folder.

All the test adds to a page is in PAGES, a Step per code block: flags appended to a command (tiny sizes, few
steps), code run before a block and asserts after it. A block added to or removed from a page, or a docs/ page
PAGES does not list, fails until PAGES says what to do with it.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.remote_code import BLOCK_HF_TINYTX
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env, run_side_by_side


DOCS = REPO_ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    section: str  # the heading above the block
    language: str
    text: str


@dataclass(frozen=True)
class Step:
    section: str
    language: str
    skip: str = ""  # why the block is not run (empty: it runs)
    append: dict | None = None  # {command prefix: extra flags} added to the end of each such command
    prefix: str = ""  # code run before the block's own (Python, or shell for a bash block)
    check: str = ""  # code run after the block's own (asserts on what it defined; shell commands for bash)


# The user's own text for the README's --train_file example: two files of numbered paragraphs.
WRITE_MY_TEXTS = (
    "mkdir -p my_texts && python -c \"import pathlib; [pathlib.Path(f'my_texts/part{p}.txt').write_text("
    "'\\n\\n'.join(f'Paragraph {i} of part {p}: the cat sat on the mat, and the dog sat on the log.' "
    "for i in range(150))) for p in (1, 2)]\"\n"
)
# The README's Tiny Shakespeare download, offline: `curl` writes a made-up play instead.
OFFLINE_SHAKESPEARE = (
    "curl() { python -c \"import pathlib, random; r = random.Random(0); pathlib.Path('input.txt').write_text("
    "'\\n\\n'.join('ROMEO:\\n' + ' '.join(r.choice(['love', 'night', 'fair', 'moon', 'swear', 'thou', "
    "'art', 'my', 'lady']) for _ in range(40)) for _ in range(400)))\"; }\n"
)
# The plan still measures this machine and plans; the clock is short, so the run is too.
PLANNED_SHORT = ["--max_train_seconds", "3", "--eval_steps", "1000"]
# Tiny sizes for the README's pre-training command; the rest of the walkthrough uses the model it writes.
TINY_PRETRAIN = [*TINY_PRETRAIN_ARGS, "--max_train_steps", "30", "--eval_steps", "30"]
FEW_FINETUNE_STEPS = ["--max_steps", "4"]


@dataclass(frozen=True)
class Page:
    path: str  # relative to the repository root
    steps: tuple[Step, ...] = ()


ENGINE_LLAMA_CPP = "llama.cpp's Python API and its OpenAI-compatible server"
# docs/performance.md's compiled decoding, on the trained model, beside eager decoding of the same prompt.
COMPILE_PREFIX = (
    "import torch\nimport hf_tinytx\nfrom transformers import AutoModelForCausalLM\nmodel = "
    "AutoModelForCausalLM.from_pretrained('out/tinytx')\ninput_ids = "
    "torch.tensor([[model.config.bos_token_id, 5, 9, 12]])\neager_ids = model.generate(input_ids, "
    "max_new_tokens=64, cache_implementation='static', do_sample=False)\n"
)

# In the order a user follows them: the README's quick start writes out/tinytx, which the pages after it use.
PAGES = [
    Page(
        "README.md",
        (
            Step(
                "Quick start", "bash",
                skip="installs packages, trains the default model and runs the quick stage",
            ),
            Step("The `tinytx` command", "bash"),
            Step(
                "Using the model in Python", "python",
                check="assert type(model).__name__ == 'TinyTxForCausalLM'",
            ),
            Step(
                "Loading with and without the package", "python",
                check="assert type(model).__module__ == 'hf_tinytx.modeling_tinytx'",
            ),
            Step(
                "Loading with and without the package",
                "python",
                prefix=BLOCK_HF_TINYTX,
                check="assert type(model).__module__.startswith('transformers_modules')\nassert not "
                "any(name.startswith('hf_tinytx') for name in sys.modules)",
            ),
            Step(
                "Training from scratch (`training/pretrain.py`)", "bash",
                append={"python training/pretrain.py": TINY_PRETRAIN},
            ),
            Step(
                "Generating text with the model you trained",
                "python",
                check="assert output.shape[1] > inputs['input_ids'].shape[1]\n"
                "assert tokenizer.decode(output[0], skip_special_tokens=True)"
                '.startswith("The animal didn\'t")',
            ),
            # prints what the Python prints (checked below)
            Step("Generating text with the model you trained", "bash"),
            Step(
                "Training on your own text", "bash", prefix=OFFLINE_SHAKESPEARE,
                append={"python training/pretrain.py": PLANNED_SHORT},
                check="grep -q '\"plan\": {' out/shakespeare/training_args.json && grep -q 'Planned for the "
                "text' out/shakespeare/README.md",
            ),
            Step("Training on your own text", "text", skip="the plan line the command above prints"),
            Step("Training on your own text", "text", skip="a sample the trained model wrote"),
            Step(
                "Training on your own text", "bash", prefix=WRITE_MY_TEXTS,
                append={"python training/pretrain.py": [*TINY_PRETRAIN_ARGS, "--max_train_steps", "4"]},
                check="test -f out/mine/model.safetensors && grep -q my_texts out/mine/training_args.json",
            ),
            Step("Tests", "bash", skip="the three test stages, this test included"),
        ),
    ),
    Page("docs/training.md", (
        Step("The run plans itself", "text", skip="a plan line, as a run prints it"),
        Step("A run that lost its machine: resuming from the Hub", "bash",
             skip="it needs a Hub: tests/training/publish/test_hub_resume.py runs it against the local one"),
    )),
    Page(
        "docs/finetuning.md",
        (
            Step(
                "Fine-tuning (Trainer, LoRA, merge)", "bash",
                append={"python training/finetune.py": FEW_FINETUNE_STEPS},
            ),
            Step(
                "Fine-tuning (Trainer, LoRA, merge)",
                "python",
                check="assert 0 <= sft_right <= 29 and 0 <= chat_right <= 29\nassert type(model).__name__ "
                "== 'PeftModelForCausalLM'",
            ),
        ),
    ),
    Page("docs/attention.md", (Step("Looking at a model's attention", "bash"),)),
    Page(
        "docs/serving.md",
        (
            Step("Converting to and from Llama", "bash"),
            Step(
                ENGINE_LLAMA_CPP, "python",
                skip="needs .venv-llamacpp: test_llama_cpp_recipes.py runs it there",
            ),
            Step(
                ENGINE_LLAMA_CPP, "python",
                skip="needs .venv-llamacpp: test_llama_cpp_recipes.py runs it there, then a q8_0 file",
            ),
            Step(
                ENGINE_LLAMA_CPP, "bash",
                skip="a server that runs until stopped: test_llama_cpp_recipes.py starts it in "
                     ".venv-llamacpp",
            ),
            Step(
                ENGINE_LLAMA_CPP, "python",
                skip="a client of that server: test_llama_cpp_recipes.py runs it against the server",
            ),
            Step("vLLM", "bash", skip="installs vLLM (3.5 GB) into .venv-vllm; .ci/run runs these commands"),
            Step("vLLM", "bash", skip="the GPU install; no GPU here"),
            Step("vLLM", "python", skip="needs .venv-vllm: test_vllm.py runs it there, on a trained folder"),
            Step(
                "vLLM", "bash", skip="a server that runs until stopped: test_vllm.py starts it in .venv-vllm"
            ),
            Step("vLLM", "python", skip="a client of that server: test_vllm.py runs it against the server"),
            Step(
                "ONNX and `torch.export`", "bash",
                skip="installs packages: pyproject's onnx extra, part of .[test]",
            ),
            Step(
                "ONNX and `torch.export`", "python", skip="test_onnx_recipe.py runs it, then the next block"
            ),
            Step("ONNX and `torch.export`", "python", skip="test_onnx_recipe.py runs it after the export"),
        ),
    ),
    Page("docs/scaling.md"),
    Page("docs/faults.md"),
    Page(
        "docs/performance.md",
        (
            Step(
                "Decoding on a CPU",
                "python",
                prefix=COMPILE_PREFIX,
                check="assert torch.equal(output_ids, eager_ids)\nassert "
                "torch._dynamo.utils.counters['stats']['unique_graphs'] >= 2  # prefill and decoding step",
            ),
            Step(
                "GPUs", "bash",
                skip="downloads ~55 MB of Python 3.12 wheels for the offline GPU machine; run before a GPU "
                     "session",
            ),
        ),
    ),
    Page("docs/model.md"),
    Page("docs/results.md"),
]


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a markdown text, each with the nearest heading above it."""
    blocks, section, language, lines = [], "", None, []
    for line in text.splitlines():
        fence = FENCE.match(line)
        if language is None and line.startswith("#"):
            section = line.lstrip("#").strip()
        elif language is None and fence:
            language, lines = fence.group(1), []
        elif language is not None and line.strip() == "```":
            blocks.append(Block(section, language, "\n".join(lines) + "\n"))
            language = None
        elif language is not None:
            lines.append(line)
    return blocks


def page_blocks(path: str | Path) -> list[Block]:
    """The code blocks of a page, by its path from the repository root."""
    return readme_blocks((REPO_ROOT / path).read_text(encoding="utf-8"))


def section_block(path: str, section: str, language: str, containing: str) -> str:
    """The one block in `language` of the page's `section` holding `containing`
    (how engine tests read recipes)."""
    found = [b.text for b in page_blocks(path) if b.section == section and b.language == language
             and containing in b.text]
    assert len(found) == 1, f"{path} section {section!r}: expected one {language} block with {containing!r}"
    return found[0]


def page_texts() -> dict[str, str]:
    return {page.path: (REPO_ROOT / page.path).read_text(encoding="utf-8") for page in PAGES}


def headings(text: str) -> list[str]:
    """The markdown headings of a text, outside its code blocks."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.append(line.lstrip("#").strip())
    return found


def anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def append_flags(script: str, command: str, flags: list[str]) -> str:
    """`flags` added to the end of every `command ...` line of a bash script
    (continuations joined, a comment kept)."""
    lines = script.replace("\\\n", " ").splitlines()
    hits = 0
    for i, line in enumerate(lines):
        if line.startswith(command):
            code, hash_, comment = line.partition(" #")
            lines[i] = f"{code.rstrip()} {' '.join(flags)}" + (f"  #{comment}" if hash_ else "")
            hits += 1
    assert hits, f"the block no longer runs `{command}`:\n{script}"
    return "\n".join(lines) + "\n"


def checkout_paths(script: str) -> str:
    """`python training/x.py` names a file of the checkout the page is read in: run the checkout's file."""
    return re.sub(r"(?<=python )training/", f"{REPO_ROOT}/training/", script)


def run_block(step: Step, block: Block, workdir: Path, env: dict, number: int,
              where: str = "README.md") -> subprocess.CompletedProcess:
    if block.language == "python":
        path = workdir / f"readme_block_{number}.py"
        path.write_text(f"{step.prefix}\n{block.text}\nimport sys\n{step.check}\n")
        command = [sys.executable, str(path)]
    else:
        script = block.text
        for prefix, flags in (step.append or {}).items():
            script = append_flags(script, prefix, flags)
        script = f"{step.prefix}{script}\n{step.check}\n"  # for bash, prefix and check are shell commands
        command = ["bash", "-e", "-o", "pipefail", "-c", checkout_paths(script)]
    result = subprocess.run(
        command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        # no stdin: a prompt for input (e.g. to trust remote code) fails at once
        timeout=600,
    )
    assert result.returncode == 0, (
        f"{where} block {number} ({block.section}, {block.language}) failed "
        f"({result.returncode}):\n{block.text}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


def user_env(tmp_path: Path) -> dict:
    """Offline with private caches, and this interpreter as `python`, as in an
    activated virtual environment."""
    env = pretrain_env(tmp_path)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


@pytest.mark.parametrize("page", PAGES, ids=[page.path for page in PAGES])
def test_readme_blocks_are_all_accounted_for(page):
    found = [(b.section, b.language) for b in page_blocks(page.path)]
    expected = [(s.section, s.language) for s in page.steps]
    assert found == expected, (
        f"{page.path}'s code blocks changed; say in test_readme.py PAGES how each is run (or why not).\n"
        f"{page.path}: {found}\nPAGES: {expected}"
    )


def test_every_docs_page_is_listed():
    listed = [page.path for page in PAGES]
    assert listed[0] == "README.md" and len(set(listed)) == len(listed), listed
    on_disk = sorted(path.relative_to(REPO_ROOT).as_posix() for path in DOCS.glob("**/*.md"))
    assert (
        sorted(listed[1:]) == on_disk
    ), f"list each docs/ page in test_readme.py PAGES: {on_disk} vs {listed}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_pages_relative_links_resolve():
    """Each relative link or image of the pages names a file that exists, and a
    #fragment a heading of that page."""
    broken = []
    for path, text in page_texts().items():
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, fragment = target.partition("#")
            resolved = (REPO_ROOT / path).parent / file if file else REPO_ROOT / path
            if not resolved.exists():
                broken.append(f"{path}: {target} (no such file)")
            elif fragment and fragment not in {
                anchor(h) for h in headings(resolved.read_text(encoding="utf-8"))
            }:
                broken.append(f"{path}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.mark.deep
def test_readme_runs_top_to_bottom(tmp_path):
    workdir = tmp_path / "user"
    workdir.mkdir()
    env = user_env(tmp_path)
    outputs, number = {}, 0
    for page in PAGES:
        blocks = page_blocks(page.path)
        assert len(blocks) == len(page.steps), "see test_readme_blocks_are_all_accounted_for"
        for step, block in zip(page.steps, blocks):
            assert (block.section, block.language) == (step.section, step.language)
            if not step.skip:
                outputs[step.section, block.language] = run_block(
                    step, block, workdir, env, number, page.path
                ).stdout
            number += 1

    out = workdir / "out"
    # Using the model in Python: a saved folder with weights, config and code,
    # beside (not above) the trained ones.
    assert {"model.safetensors", "config.json", "modeling_tinytx.py"} <= set(
        os.listdir(workdir / "random-tinytx")
    )
    assert not (out / "config.json").exists()
    assert "tensor([[" in outputs["Using the model in Python", "python"]
    # `tinytx generate` prints, streamed, what the README's Python prints.
    generating = "Generating text with the model you trained"
    assert outputs[generating, "bash"] == outputs[generating, "python"]
    assert outputs[generating, "bash"].startswith("The animal didn't cross the street because")
    # The walkthrough's pre-trained model, fine-tuned in full and with LoRA
    # (adapter, merged): docs/finetuning.md.
    assert (out / "tinytx" / "model.safetensors").is_file()
    assert (out / "sft" / "model.safetensors").is_file()
    assert (out / "chat-lora" / "adapter_model.safetensors").is_file()
    assert (out / "chat-lora" / "merged" / "model.safetensors").is_file()
    # What the README says of `tinytx chat`: pretrain and a prompt/response fine-tune write no
    # chat template, a chat fine-tune does.
    for folder, template in (("tinytx", False), ("sft", False), ("chat-lora/merged", True)):
        assert (out / folder / "chat_template.jinja").is_file() == template, folder
    # docs/attention.md's interpret command ranks the head that resolves "it", at each
    # of the three places it is read.
    report = json.loads((workdir / "maps" / "heads.json").read_text())
    assert {"previous_token", "first_token", "coref@it", "coref@adjective", "coref@last"} <= set(
        report["heads"]
    )
    # docs/serving.md's converter round trip: a Llama folder and a TinyTx folder again.
    assert json.loads((out / "llama" / "config.json").read_text())["model_type"] == "llama"
    assert json.loads((out / "tinytx-again" / "config.json").read_text())["model_type"] == "tinytx"


# A short pre-training run: the card, not the model's quality, is under test.
SHORT_RUN = [
    "--max_train_steps", "4", "--eval_steps", "100", "--num_probes_per_kind", "0", "--num_samples", "0",
]


@pytest.mark.deep
@pytest.mark.parametrize("pushed", [False, True], ids=["local", "pushed"])
def test_model_card_snippets_load_and_generate(pushed, run_pretrain, local_hub, tmp_path):
    """The card's "How to use" code, run from another folder, with the package and without it: it names the
    absolute model folder, or the Hub id when the run pushed (then it loads from the Hub)."""
    output_dir = tmp_path / "model"
    repo_id = f"{local_hub.user}/tiny"
    env = user_env(tmp_path)
    if pushed:
        env = {k: v for k, v in env.items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))}
        env.update(local_hub.client_env(tmp_path / "hf_home"))
        run_pretrain(
            "--output_dir", output_dir, *SHORT_RUN, "--push_to_hub", "--hub_model_id", repo_id, env=env
        )
    else:
        run_pretrain("--output_dir", output_dir, *SHORT_RUN, env=env)
    card = (output_dir / "README.md").read_text(encoding="utf-8")
    assert "pip install -e ." in card and "pip install hf_tinytx" not in card
    blocks = [b for b in readme_blocks(card) if b.section == "How to use" and b.language == "python"]
    assert len(blocks) == 2, f"expected the card's two Python snippets (with and without hf_tinytx):\n{card}"
    load_from = repr(repo_id if pushed else os.path.abspath(output_dir)).replace("'", '"')
    assert all(f"from_pretrained({load_from}" in block.text for block in blocks)
    if pushed:
        shutil.rmtree(output_dir)  # only the Hub can serve the model now
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for number, (block, prefix, module) in enumerate(
        [(blocks[0], "", "hf_tinytx."), (blocks[1], BLOCK_HF_TINYTX, "transformers_modules.")]
    ):
        step = Step("How to use", "python", prefix=prefix, check=(
            f"assert type(model).__module__.startswith({module!r})\n"
            "assert output.shape[1] > inputs['input_ids'].shape[1]"
        ))
        result = run_block(step, block, elsewhere, env, number, "the model card")
        assert result.stdout.strip(), "the snippet prints the generated text"


BENCHMARK_COMMAND = re.compile(r"python (benchmarks/\w+\.py|-m benchmarks\.\w+)")


def test_the_benchmark_commands_the_readme_names_start():
    """Each `python benchmarks/X.py` or `python -m benchmarks.X` of the pages, run from the repository root as
    written, answers --help before torch loads."""
    commands = sorted(
        {command for text in page_texts().values() for command in BENCHMARK_COMMAND.findall(text)}
    )
    assert len(commands) >= 5, commands
    results = run_side_by_side(
        {command: ([sys.executable, "-X", "importtime", *command.split(), "--help"], REPO_ROOT, None)
         for command in commands},
        timeout=240,
    )
    for command, result in results.items():
        assert (
            result.returncode == 0 and "usage" in result.stdout.lower()
        ), f"python {command}: {result.stderr[-500:]}"
        # what -X importtime lists
        imported = re.findall(r"^import time:.*\| +(\S+)$", result.stderr, re.MULTILINE)
        assert "torch" not in imported, f"python {command} --help imports torch before answering"
