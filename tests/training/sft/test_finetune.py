"""training/finetune.py: end to end in subprocesses as a user runs it (full fine-tuning of a Hub base,
LoRA + merge + push on chat records, model cards, bad input refused in one line before anything is written
or uploaded; all runs start together in one module fixture), and its data in process
(training/sft/data.py: rows, counts, templates)."""

import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_tinytx
from hf_tinytx_training.distributed import sharding
from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.sft.data import IGNORE_INDEX, build_examples, ensure_chat_template, tokenize_record
from hf_tinytx_training.sft.records import read_records
from tests.helpers.tiny import LAUNCH, REPO_ROOT, build_byte_bpe_tokenizer, build_tiny_model, run_side_by_side
from tests.training.publish.test_hub import assert_token_nowhere


FINETUNE = REPO_ROOT / "training" / "finetune.py"
QUICK = [
    "--max_steps", "8", "--per_device_train_batch_size", "4", "--learning_rate", "5e-3",
    "--logging_steps", "2", "--save_strategy", "no", "--use_cpu", "--seed", "0", "--disable_tqdm", "true",
]

# each bad input replaces one
GOOD_INPUTS = ["--model_name_or_path", "bases/gated", "--train_file", "train.jsonl"]
# a base model on the (local) Hub, uploaded in a child because the client reads HF_ENDPOINT on import
UPLOAD = (
    "import sys; from huggingface_hub import HfApi; api = HfApi(); api.create_repo(sys.argv[1]); "
    "api.upload_folder(repo_id=sys.argv[1], folder_path=sys.argv[2])"
)

# Inputs refused by the real script: name -> (flags that replace GOOD_INPUTS' or add to them,
# words of the one-line message, a text no Hub request may contain or None). Those refused before
# torch loads are a table in test_finetune_args.py, run in process; two of them run here too,
# where a (local) Hub records every request.
PUSH = ["--push_to_hub", "--hub_model_id"]
FAILURES = {
    "typo_path": (
        ["--model_name_or_path", "bases/gatedd"],  # at once, not after a Hub lookup
        ["'bases/gatedd': no such folder (did you mean 'bases/gated'?)"],
        "gatedd",
    ),
    "link_out": (
        [*PUSH, "tester/linked", "--output_dir", "linked"],
        ["linked/notes.txt is a link to", "secret.txt, outside", "never read or uploaded"], "tester/linked",
    ),
    # A mistyped flag may be one of Trainer's: it is named once TrainingArguments (torch) has loaded.
    "typo": (
        ["--learnig_rate", "1e-3"],
        ["finetune.py: error: unknown flag --learnig_rate; did you mean --learning_rate?"], None,
    ),
    "abbreviation": (
        ["--max_step", "3"], ["finetune.py: error: unknown flag --max_step; did you mean --max_steps?"], None,
    ),
    # A chat template that does not parse, or raises on a record: found as the records render.
    "unparsable": (
        ["--model_name_or_path", "bases/unparsable", "--train_file", "chat.jsonl"],
        [
            "the tokenizer's chat template (",
            "unparsable/chat_template.jinja) does not parse (unexpected '}', template line 1); fix the "
            "template",
        ],
        None,
    ),
    "template": (
        ["--model_name_or_path", "bases/templated", "--train_file", "chat.jsonl"],
        [
            "chat.jsonl, line 2: the tokenizer's chat template (",
            "templated/chat_template.jinja) failed on this conversation (TemplateError: Conversation roles "
            "must alternate); fix the template",
        ],
        None,
    ),
}
ROW, LONG = 32, "word " * 100  # max_seq_length of the data tests; ~300 tokens, three times a row and more
BAD_TEMPLATES = {
    "raises": (
        "{% if messages|length > 2 %}{{ raise_exception('Conversation roles must alternate') }}{% endif "
        "%}{% for m in messages %}{{ m['content'] + eos_token }}{% endfor %}",
        "failed on this conversation (TemplateError: Conversation roles must alternate)",
    ),
    "does_not_parse": (
        "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}",
        "does not parse (unexpected '}', template line 2)",
    ),
}
def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def prompt_records(n, offset=0):
    return [
        {"prompt": f"Q: add {i} and {i + 1}\nA:", "response": f" {2 * i + 1}"}
        for i in range(offset, offset + n)
    ]


def chat_records(n):
    records = []
    for i in range(n):
        messages = [{"role": "user", "content": f"Repeat {i}."}, {"role": "assistant", "content": f"{i} {i}"}]
        if i % 2:  # some conversations have a system turn and a second exchange
            messages = [{"role": "system", "content": "Be brief."}, *messages,
                        {"role": "user", "content": "Again."}, {"role": "assistant", "content": f"{i}"}]
        records.append({"messages": messages})
    return records


def save_folders_beside_the_runs(root: Path) -> None:
    """Another user's model, another run's folder, a user's folder with a config.json, and a file: what a
    destination must never replace."""
    save_base(root / "other")
    save_base(root / "pretrained")
    (root / "pretrained" / "checkpoints" / "step_2").mkdir(parents=True)
    (root / "pretrained" / "metrics.jsonl").write_text('{"step": 2}\n')
    (root / "mine").mkdir()
    (root / "mine" / "config.json").write_text('{"my": "settings"}\n')  # the user's, beside the runs' folders
    (root / "a_file").write_text("not a folder\n")


def save_base(folder: Path, **overrides) -> Path:
    """A tiny TinyTx + tokenizer folder, the script's --model_name_or_path."""
    tokenizer = build_byte_bpe_tokenizer()
    build_tiny_model(seed=0, vocab_size=len(tokenizer), **overrides).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_bad_inputs(root: Path) -> None:
    """The files behind FAILURES."""
    (root / "linked").mkdir()
    (root / "secret.txt").write_text("not for the Hub")
    (root / "linked" / "notes.txt").symlink_to(root / "secret.txt")  # a link out of the output folder
    for name, template in (("templated", BAD_TEMPLATES["raises"][0]),
                           ("unparsable", "{% for m in messages %}{{ m['content'] }{% endfor %}")):
        save_base(root / "bases" / name)
        tokenizer = AutoTokenizer.from_pretrained(root / "bases" / name)
        tokenizer.chat_template = template
        tokenizer.save_pretrained(root / "bases" / name)
    long_reply, long_prompt = {"prompt": "Q: say word\nA:", "response": LONG}, {
        "prompt": LONG, "response": " 3",
    }
    write_jsonl(root / "cut.jsonl", [*prompt_records(48), long_reply, long_reply, long_prompt])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.helpers.hub_server import LocalHub

    root = tmp_path_factory.mktemp("finetune")
    gated = save_base(root / "bases" / "gated")
    plain = save_base(root / "bases" / "plain", mlp_type="plain", hidden_act="gelu")  # no gate_proj to adapt
    write_jsonl(root / "train.jsonl", prompt_records(24))
    write_jsonl(root / "validation.jsonl", prompt_records(4, offset=50))
    write_jsonl(root / "chat.jsonl", chat_records(12))
    (root / "documents.txt").write_text("".join(f"Document {i} counts to {i + 1}.\n" for i in range(16)))
    write_bad_inputs(root)

    commands = {  # cwd is root: relative paths are as a user would type them
        # a base on the Hub
        "full": [
            "--model_name_or_path", "tester/tiny-base", "--train_file", "train.jsonl",
            "--validation_file", "validation.jsonl", "--packing", "--max_seq_length", "48",
            "--output_dir", "full", "--push_to_hub", "--hub_model_id", "tester/tiny-sft", *QUICK,
            "--save_strategy", "steps", "--save_steps", "4", "--bf16",
        ],
        "lora": lora_args("lora"),
        "cut": [
            "--model_name_or_path", "bases/gated", "--train_file", "cut.jsonl", "--max_seq_length", "32",
            "--output_dir", "cut", *QUICK, "--max_steps", "2",
        ],
        **{
            name: [*GOOD_INPUTS, "--output_dir", f"never-{name}", *flags]
            for name, (flags, *_) in FAILURES.items()
        },
    }
    commands = {name: [sys.executable, str(FINETUNE), *args] for name, args in commands.items()}
    # LoRA on two processes (no --use_cpu: the script sets up CPU data parallelism itself), on a .txt file.
    ddp_args = [arg for arg in lora_args("lora_ddp") if arg != "--use_cpu"]
    ddp_args[ddp_args.index("chat.jsonl")] = "documents.txt"
    ddp_args += ["--lora_target_modules", "q_proj,v_proj", "--lora_dropout", "0.1"]
    commands["lora_ddp"] = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", LAUNCH,
        "--mark-at-exit", str(root / "shutdown"), str(FINETUNE), *ddp_args,
    ]
    with LocalHub(user="tester") as hub:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_"))
        }
        env.update(hub.client_env(root / "hf_home"))
        env["OMP_NUM_THREADS"] = "1"  # many processes on a small machine: no thread oversubscription
        subprocess.run([sys.executable, "-c", UPLOAD, "tester/tiny-base", str(gated)], env=env, check=True)
        results = run_side_by_side(
            {name: (command, root, env) for name, command in commands.items()}, timeout=600
        )
        repos = ("tiny-sft", "tiny-chat-lora", "tiny-chat-lora_ddp")
        hub_files = {repo: hub.repo_files(f"tester/{repo}") for repo in repos}
        hub_commits = {repo: len(hub.commits(f"tester/{repo}")) for repo in repos}
        requested = [request.path for request in hub.recorded()]
        token = hub.token
    return {"root": root, "results": results, "hub_files": hub_files, "hub_commits": hub_commits,
            "requested": requested, "token": token, "gated": gated, "plain": plain}


def lora_args(name: str) -> list[str]:
    return ["--model_name_or_path", "bases/plain", "--train_file", "chat.jsonl", "--use_peft", "--merge",
            "--lora_r", "4", "--lora_alpha", "8", "--output_dir", name,
            "--push_to_hub", "--hub_model_id", f"tester/tiny-chat-{name}", *QUICK]


def succeeded(result):
    assert result.returncode == 0, f"finetune.py failed\nSTDOUT:\n{result.stdout}\nSTDERR:\n{result.stderr}"


@pytest.mark.deep
def test_full_finetune_from_a_hub_base_on_prompt_response_data(runs):
    succeeded(runs["results"]["full"])
    out = runs["root"] / "full"
    for name in (
        "model.safetensors", "config.json", "modeling_tinytx.py", "tokenizer.json", "finetune_args.json",
    ):
        assert (out / name).is_file(), name
    assert not list(out.rglob("*model*.bin")), "weights only as safetensors"
    assert (out / "checkpoints" / "checkpoint-8" / "model.safetensors").is_file()
    assert not (out / ".lock").exists()  # a finished run leaves no stale lock
    assert_token_nowhere(
        runs["token"], [out], [runs["results"]["full"].stdout, runs["results"]["full"].stderr]
    )
    # On a CPU under glibc the run keeps freed memory for the next step (test_cpu_memory.py: what that does).
    announced = "Freed memory stays in the process" in runs["results"]["full"].stdout
    assert announced == (platform.libc_ver()[0] == "glibc")
    # --bf16 on a CPU whose oneDNN has no bf16 kernels (AVX2 only): one line says it is slow there
    warned = sharding.slow_bf16("--bf16") in runs["results"]["full"].stdout
    assert warned == (not sharding.cpu_runs_bf16_fast())

    # The final model went to the Hub, without the checkpoints kept next to it.
    hub_files = runs["hub_files"]["tiny-sft"]
    assert hub_files.get("model.safetensors") == (out / "model.safetensors").read_bytes()
    assert "modeling_tinytx.py" in hub_files and "tokenizer.json" in hub_files
    assert not any(name.startswith("checkpoints/") for name in hub_files)
    metrics = json.loads((out / "finetune_metrics.json").read_text())
    assert metrics["train_loss"] > 0 and metrics["eval_loss"] > 0

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    base = AutoModelForCausalLM.from_pretrained(runs["gated"]).eval()  # what tester/tiny-base holds
    assert type(model) is hf_tinytx.TinyTxForCausalLM
    pairs = zip(model.state_dict().values(), base.state_dict().values(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)

    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = tokenizer("Q: add 3 and 4\nA:", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert output.shape[1] > inputs["input_ids"].shape[1]


def test_lora_finetune_on_chat_data_merges_and_pushes(runs, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM

    succeeded(runs["results"]["lora"])
    out = runs["root"] / "lora"
    assert (out / "adapter_model.safetensors").is_file()
    assert not list(out.rglob("*model*.bin")), "weights only as safetensors"
    assert_token_nowhere(
        runs["token"], [out], [runs["results"]["lora"].stdout, runs["results"]["lora"].stderr]
    )
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    # The default targets minus gate_proj, which a plain-MLP TinyTx does not have.
    assert set(adapter_config["target_modules"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj",
    }
    # Given as bases/plain from the run's folder, stored absolute: the adapter loads from anywhere.
    assert adapter_config["base_model_name_or_path"] == str(runs["plain"])
    monkeypatch.chdir(tmp_path)

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template, "chat data should have given the tokenizer a chat template"
    messages = [{"role": "user", "content": "Repeat 3."}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )

    adapted = AutoPeftModelForCausalLM.from_pretrained(out).eval()
    merged_dir = out / "merged"
    for name in ("model.safetensors", "config.json", "modeling_tinytx.py", "configuration_tinytx.py"):
        assert (merged_dir / name).is_file(), name
    assert "auto_map" in json.loads((merged_dir / "config.json").read_text())
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert type(merged) is hf_tinytx.TinyTxForCausalLM
    with torch.no_grad():
        torch.testing.assert_close(merged(**inputs).logits, adapted(**inputs).logits, rtol=0, atol=1e-5)
        from_adapter = adapted.generate(**inputs, max_new_tokens=6, do_sample=False)
        from_merged = merged.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert from_adapter.tolist() == from_merged.tolist()
    assert AutoTokenizer.from_pretrained(merged_dir).chat_template == tokenizer.chat_template

    # With --merge, the merged model is what goes to the Hub.
    hub_files = runs["hub_files"]["tiny-chat-lora"]
    assert hub_files.get("model.safetensors") == (merged_dir / "model.safetensors").read_bytes()
    assert "modeling_tinytx.py" in hub_files and "adapter_model.safetensors" not in hub_files


def test_lora_on_two_data_parallel_processes_saves_and_pushes_once(runs):
    """Neither process runs the interpreter's shutdown beside gloo's threads
    (training/cli.exit_launched_process)."""
    from safetensors.torch import load_file

    result = runs["results"]["lora_ddp"]
    succeeded(result)
    for line in ("LoRA adapter saved to", "Merged model saved to", "Pushed the merged model to the Hub"):
        assert result.stdout.count(line) == 1, result.stdout
    assert not list(runs["root"].glob("shutdown.rank*")), "a process ran the interpreter's shutdown"
    out = runs["root"] / "lora_ddp"
    card = (out / "README.md").read_text()
    assert "x 2 device(s)" in card  # one data-parallel run, not two runs side by side
    assert "16 text records" in card
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert (
        set(adapter_config["target_modules"]) == {"q_proj", "v_proj"}
        and adapter_config["lora_dropout"] == 0.1
    )
    lora_b = [
        tensor for name, tensor in load_file(out / "adapter_model.safetensors").items() if "lora_B" in name
    ]
    assert lora_b and all(
        tensor.abs().sum() > 0 for tensor in lora_b
    ), "LoRA's B starts at zero: it never trained"
    # One push, as from one process: the same number of commits as the single-process run's repo.
    assert runs["hub_commits"]["tiny-chat-lora_ddp"] == runs["hub_commits"]["tiny-chat-lora"]
    pushed = runs["hub_files"]["tiny-chat-lora_ddp"]
    assert pushed.get("model.safetensors") == (out / "merged" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("case", list(FAILURES))
def test_bad_input_is_one_line_before_anything_is_written_or_uploaded(runs, case):
    _, words, hub_mark = FAILURES[case]
    result = runs["results"][case]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    # found only as the records render, after the model loaded (its progress bar above)
    if case == "template":
        assert all(line.startswith("Loading weights") for line in lines[:-1]), lines
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("finetune.py: error: "), lines
    assert all(word in lines[0] for word in words), lines[0]
    if words[0].startswith("finetune.py: "):  # the whole line
        assert lines[0] == words[0]
    assert not (runs["root"] / f"never-{case}").exists(), "nothing may be written"
    assert not (runs["root"] / "bases" / "gated" / "sft").exists()
    # link_out's output_dir
    assert [path.name for path in (runs["root"] / "linked").iterdir()] == ["notes.txt"]
    if hub_mark:
        assert not [path for path in runs["requested"] if hub_mark in path], "the Hub must not be asked"


@pytest.mark.parametrize(
    "folder, kind, repo_id",
    [("full", "full", "tiny-sft"), ("lora", "adapter", None), ("lora/merged", "merged", "tiny-chat-lora")],
)
def test_model_cards_describe_the_run_and_how_to_load_it(runs, folder, kind, repo_id):
    from huggingface_hub import ModelCard

    path = runs["root"] / folder / "README.md"
    text = path.read_text(encoding="utf-8")
    assert "[More Information Needed]" not in text  # PEFT's placeholder card was replaced
    card = ModelCard.load(path)
    assert card.data.library_name == ("peft" if kind == "adapter" else "transformers")
    assert card.data.pipeline_tag == "text-generation" and card.data.datasets is None  # local data files
    # A Hub base is metadata too; a local base only in the text (the Hub accepts repo ids there, not paths).
    base = "tester/tiny-base" if kind == "full" else str(runs["plain"])
    assert f"| Base model | {'[`' if kind == 'full' else '`'}{base}`" in card.text
    assert card.data.base_model == ("tester/tiny-base" if kind == "full" else None)

    run_folder = runs["root"] / folder.split("/")[0]
    metrics = json.loads((run_folder / "finetune_metrics.json").read_text())
    assert "| Optimizer steps | 8 (" in card.text
    assert ("24 prompt/response records" if kind == "full" else "12 chat records") in card.text
    assert f"| Training loss, mean over the run | {metrics['train_loss']:.4f} |" in card.text
    if kind == "full":
        assert f"| Validation loss, at the end | {metrics['eval_loss']:.4f} |" in card.text
    assert ("| LoRA | r 4, alpha 8" in card.text) == (kind != "full")

    load_from = f"tester/{repo_id}" if repo_id else str(run_folder)  # the pushed folder names its repo
    loader = "AutoPeftModelForCausalLM" if kind == "adapter" else "AutoModelForCausalLM"
    assert f'{loader}.from_pretrained("{load_from}")' in card.text
    assert ("PeftModel.from_pretrained(base" in card.text) == (kind == "adapter")
    assert "trust_remote_code=True" in card.text  # how to load TinyTx without the package
    if repo_id:
        assert runs["hub_files"][repo_id]["README.md"] == path.read_bytes()


def test_loss_covers_only_the_responses(byte_bpe_tokenizer):
    """Labels are -100 on every prompt token: what remains to learn is exactly the replies (and their EOS)."""
    tokenizer = byte_bpe_tokenizer()
    assert ensure_chat_template(tokenizer)

    def learned_text(record):
        example = tokenize_record(record, tokenizer)
        assert len(example["input_ids"]) == len(example["labels"])
        return tokenizer.decode([label for label in example["labels"] if label != IGNORE_INDEX])

    assert learned_text({"kind": "prompt", "prompt": "Q: 2+2?\nA:", "response": " 4"}) == " 4</s>"
    conversation = chat_records(2)[1]["messages"]  # system, user, assistant "1 1", user, assistant "1"
    assert learned_text({"kind": "chat", "messages": conversation}) == "1 1</s>1</s>"

    records = [{"kind": "prompt", **record} for record in prompt_records(6)]
    padded = build_examples(records, tokenizer, max_seq_length=64, packing=False)
    packed = build_examples(records, tokenizer, max_seq_length=8, packing=True)
    assert len(padded) == 6 and all(row["input_ids"][-1] == tokenizer.eos_token_id for row in padded)  # whole
    # Packed rows are consecutive 8-token cuts of all examples end to end; cuts
    # holding only prompt tokens are dropped.
    stream = [token for row in padded for token in row["input_ids"]]
    cuts = [stream[i : i + 8] for i in range(0, len(stream), 8)]
    assert packed and all(row["input_ids"] in cuts for row in packed)
    assert all(any(label != IGNORE_INDEX for label in row["labels"][1:]) for row in packed)
    assert len(packed) < len(cuts)


@pytest.mark.parametrize("tokenizer_side", ["right", "left"])
def test_batches_are_padded_on_the_right_with_labels_ignored(byte_bpe_tokenizer, tokenizer_side):
    """Even for a tokenizer set to pad on the left (for batched generation), which keeps that setting."""
    from hf_tinytx_training.sft.data import pad_collator

    tokenizer = byte_bpe_tokenizer()
    tokenizer.padding_side = tokenizer_side
    pad = tokenizer.pad_token_id
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [IGNORE_INDEX, IGNORE_INDEX, 7, 8]},
            {"input_ids": [9, 10], "labels": [IGNORE_INDEX, 10]}]
    batch = pad_collator(tokenizer)(rows)
    assert tokenizer.padding_side == tokenizer_side
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert all(tensor.dtype == torch.long for tensor in batch.values())
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, pad, pad]]
    ignored = IGNORE_INDEX
    assert batch["labels"].tolist() == [[ignored, ignored, 7, 8], [ignored, 10, ignored, ignored]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_lora_without_peft_installed_says_how_to_install_it(monkeypatch):
    import importlib.util

    from transformers import TrainingArguments

    from hf_tinytx_training.sft.finetune_args import FinetuneArguments, check_args

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "peft" else real_find_spec(name, *rest))
    args = FinetuneArguments(model_name_or_path="base", train_file="data.jsonl", use_peft=True)
    with pytest.raises(UserInputError, match=r"pip install -e \"\.\[peft\]\""):
        check_args(args, TrainingArguments(output_dir="unused"))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_lora_trainable_tokens_train_those_rows_and_merge_into_the_model(tied, capsys):
    """--lora_trainable_tokens: the embedding rows of the text's tokens train beside the adapter (a base that
    never saw digits gives them rows an adapter cannot tell apart: docs/finetuning.md's LoRA learnt nothing
    without them), tied output rows with them, and the merged model answers as the adapter does."""
    from transformers import TrainingArguments

    from hf_tinytx_training.sft.finetune_args import FinetuneArguments
    from hf_tinytx_training.sft.model import add_lora

    tokenizer = build_byte_bpe_tokenizer()
    base = build_tiny_model(seed=0, vocab_size=len(tokenizer), tie_word_embeddings=tied)
    before = base.get_input_embeddings().weight.detach().clone()
    args = FinetuneArguments(model_name_or_path="base", train_file="data.jsonl", use_peft=True,
                             lora_trainable_tokens="0123456789")
    model = add_lora(base, tokenizer, args, TrainingArguments(output_dir="unused", use_cpu=True))
    digits = sorted(set(tokenizer("0123456789", add_special_tokens=False)["input_ids"]))
    assert f"embedding rows of {len(digits)} tokens: '0' '1'" in capsys.readouterr().out
    assert model.peft_config["default"].trainable_token_indices == digits

    input_ids = torch.tensor([tokenizer("Q: 12 then 34\nA: 35", add_special_tokens=False)["input_ids"]])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model.train()
    for _ in range(3):
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=input_ids).logits
        merged = model.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=input_ids).logits, adapted, rtol=0, atol=1e-5)
    after = merged.get_input_embeddings().weight.detach()
    others = [i for i in range(len(tokenizer)) if i not in digits]
    assert not torch.equal(after[digits], before[digits]), "the digits' rows should have trained"
    assert torch.equal(after[others], before[others]), "only the named tokens' rows train"
    if tied:
        assert torch.equal(merged.get_output_embeddings().weight, after)


def test_records_cut_or_dropped_by_max_seq_length_are_counted_on_the_console_and_in_the_card(runs):
    """51 records, 50 rows: three longer than a row are cut, and one of them, whose
    prompt fills its row, dropped."""
    result = runs["results"]["cut"]
    succeeded(result)
    lines = [line for line in result.stdout.splitlines() if line.startswith("cut.jsonl: ")]
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith(
        "cut.jsonl: 3 of 51 records were cut to --max_seq_length 32 tokens (the longest has "
    )
    assert lines[0].endswith(
        "); 1 of them dropped because the prompt fills the row; raise --max_seq_length (up to the model's "
        "context) or shorten those records to train on all of them."
    )
    assert "50 training rows of at most 32 tokens (padded)" in result.stdout
    card = (runs["root"] / "cut" / "README.md").read_text(encoding="utf-8")
    row = next(line for line in card.splitlines() if line.startswith("| Training data |"))
    assert row.startswith(
        "| Training data | `cut.jsonl`: 51 prompt/response records, 50 rows of at most 32 tokens (one "
        "example per row, padded); 3 records cut to 32 tokens (the longest has "
    )
    assert row.endswith("), 1 of them dropped because the prompt fills the row |")


# ---- training/sft/data.py in process: rows, what they cut or drop, and input the tokenizer cannot take


def test_padded_rows_count_what_is_cut_and_what_is_dropped(tmp_path, byte_bpe_tokenizer):
    """51 records -> 50 rows: two long ones are cut (and kept), one whose prompt fills the row is dropped."""
    tokenizer = byte_bpe_tokenizer()
    long_reply = {"prompt": "Q: say word\nA:", "response": LONG}
    long_prompt = {"prompt": LONG, "response": " 3"}
    path = write_jsonl(tmp_path / "train.jsonl", [*prompt_records(48), long_reply, long_prompt])
    (tmp_path / "more.txt").write_text(LONG + "\n")
    records = read_records(str(path)) + read_records(str(tmp_path / "more.txt"))
    whole = [tokenize_record(record, tokenizer) for record in records]
    assert all(len(example["input_ids"]) <= ROW for example in whole[:48])  # the short ones fit
    assert all(len(example["input_ids"]) > ROW for example in whole[48:])

    rows = build_examples(records, tokenizer, max_seq_length=ROW, packing=False)
    counts = rows.counts
    longest = max(len(example["input_ids"]) for example in whole)
    assert (counts.records, counts.rows, counts.cut, counts.dropped, counts.empty) == (51, 50, 3, 1, 0)
    assert counts.tokens == sum(len(example["input_ids"]) for example in whole) and counts.longest == longest
    assert counts.kept_tokens == sum(len(example["input_ids"]) for example in whole[:48]) + 2 * ROW
    # The cut records keep their first ROW tokens; the one whose prompt fills the row is gone.
    assert rows[48]["input_ids"] == whole[48]["input_ids"][:ROW]
    assert rows[49]["input_ids"] == whole[50]["input_ids"][:ROW]
    assert rows[:48]["input_ids"] == [example["input_ids"] for example in whole[:48]]
    assert counts.summary("train.jsonl", ROW, packing=False) == (
        f"train.jsonl: 3 of 51 records were cut to --max_seq_length 32 tokens (the longest has {longest}); 1 "
        "of them dropped because the prompt fills the row; raise --max_seq_length (up to the model's "
        "context) or shorten those records to train on all of them."
    )
    # Nothing cut: nothing to say.
    fitting = build_examples(records[:48], tokenizer, max_seq_length=ROW, packing=False)
    assert fitting.counts.summary("train.jsonl", ROW, packing=False) is None
    assert (fitting.counts.rows, fitting.counts.cut, fitting.counts.dropped) == (48, 0, 0)


def test_packed_rows_count_every_token_and_the_prompt_only_rows_dropped(byte_bpe_tokenizer):
    tokenizer = byte_bpe_tokenizer()
    records = [{"kind": "prompt", "prompt": LONG, "response": " 3"}] + [
        {"kind": "prompt", **record} for record in prompt_records(20)
    ]
    whole = [tokenize_record(record, tokenizer) for record in records]
    stream = [token for example in whole for token in example["input_ids"]]
    prompt_tokens = whole[0]["labels"].index(
        next(label for label in whole[0]["labels"] if label != IGNORE_INDEX)
    )
    # The rows inside the first record's prompt learn nothing: those are the ones dropped.
    dropped = prompt_tokens // ROW
    rows = build_examples(records, tokenizer, max_seq_length=ROW, packing=True)
    counts = rows.counts
    assert dropped >= 9 and (counts.records, counts.dropped, counts.cut) == (21, dropped, 0)
    assert counts.rows == len(rows) == math.ceil(len(stream) / ROW) - dropped
    assert counts.tokens == len(stream) and counts.kept_tokens == len(stream) - dropped * ROW
    # the rest, all of it
    assert [token for row in rows["input_ids"] for token in row] == stream[dropped * ROW :]
    assert counts.summary("train.jsonl", ROW, packing=True) == (
        f"train.jsonl: packed 21 records ({len(stream)} tokens) into {counts.rows} rows of at most 32 "
        f"tokens; {dropped} rows holding only prompt tokens ({dropped * ROW} tokens) were dropped."
    )
    fitting = build_examples(records[1:], tokenizer, max_seq_length=ROW, packing=True)
    assert fitting.counts.summary("t.jsonl", ROW, packing=True).endswith(
        "rows of at most 32 tokens; no token was dropped."
    )


def test_finetune_refuses_data_of_which_every_record_would_be_dropped(byte_bpe_tokenizer):
    from hf_tinytx_training.sft.finetune_run import to_dataset

    records = [{"kind": "prompt", "prompt": LONG, "response": " 3", "where": "train.jsonl, line 1"}]
    with pytest.raises(UserInputError, match=r"^No example in train.jsonl keeps a token to learn within "
                                             r"--max_seq_length 32 \(the prompts fill the whole row\)"):
        to_dataset(records, byte_bpe_tokenizer(), ROW, False, "train.jsonl")


@pytest.mark.parametrize(
    "record, what",
    [
        ({"prompt": "\ud800", "response": "A"}, '"prompt" holds a lone surrogate \\ud800 at character 1'),
        (
            {"prompt": "Q", "response": "ok \udfff"},
            '"response" holds a lone surrogate \\udfff at character 4',
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x\ud83d"}]},
            'message 1\'s "content" holds a lone surrogate \\ud83d at character 2',
        ),
    ],
    ids=["prompt", "response", "chat"],
)
def test_a_lone_surrogate_is_refused_with_its_file_and_line(tmp_path, record, what):
    """json.dumps writes the surrogate as the escape a user's file would hold
    (ensure_ascii): valid JSON, not text."""
    path = write_jsonl(tmp_path / "train.jsonl", [prompt_records(1)[0], record])
    assert "\\ud" in path.read_text()  # the file holds the escape, as ASCII
    with pytest.raises(UserInputError) as refused:
        read_records(str(path))
    assert str(refused.value) == (
        f"{path}, line 2: {what} (half of a UTF-16 pair, written as a JSON escape), which is not text; write "
        "the character itself, or both halves of its pair (e.g. \\ud83d\\ude00)."
    )


def test_a_whole_surrogate_pair_is_text(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "smile \\ud83d\\ude00", "response": "ok"}\n')
    assert read_records(str(path))[0]["prompt"] == "smile \U0001F600"


def templated_tokenizer(folder: Path, template: str, byte_bpe_tokenizer):
    """Saved and loaded again, as finetune loads a model folder's tokenizer: the
    template in chat_template.jinja."""
    tokenizer = byte_bpe_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_a_chat_template_that_raises_names_its_file_and_the_record(tmp_path, byte_bpe_tokenizer):
    template, problem = BAD_TEMPLATES["raises"]
    tokenizer = templated_tokenizer(tmp_path / "base", template, byte_bpe_tokenizer)
    assert not ensure_chat_template(tokenizer)  # it parses: the model's own template is kept
    short = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    longer = {"messages": [*short["messages"], {"role": "user", "content": "again"},
                           {"role": "assistant", "content": "hello"}]}
    path = write_jsonl(tmp_path / "chat.jsonl", [short, longer])
    records = read_records(str(path))
    assert len(build_examples(records[:1], tokenizer, max_seq_length=ROW, packing=False)) == 1
    with pytest.raises(UserInputError) as refused:
        build_examples(records, tokenizer, max_seq_length=ROW, packing=False)  # it raises on the longer one
    assert str(refused.value) == (
        f"{path}, line 2: the tokenizer's chat template ({tmp_path / 'base' / 'chat_template.jinja'}) "
        f"{problem}; fix the template, or remove it to get the default one."
    )


def test_a_chat_template_that_does_not_parse_is_refused_before_any_record_renders(
    tmp_path, byte_bpe_tokenizer
):
    template, problem = BAD_TEMPLATES["does_not_parse"]
    tokenizer = templated_tokenizer(tmp_path / "base", template, byte_bpe_tokenizer)
    with pytest.raises(UserInputError) as refused:
        ensure_chat_template(tokenizer)
    assert str(refused.value) == (
        f"the tokenizer's chat template ({tmp_path / 'base' / 'chat_template.jinja'}) {problem}; fix the "
        "template, or remove it to get the default one."
    )
