"""pretrain's data: documents read from local files, the token store (issue 55: tokenized once, in
parallel, into shards every process reads; resumed after a kill; kept up to date with its files)
and the training blocks, each epoch cut elsewhere. Builds run in this process; runs of pretrain.py
in subprocesses, faults from outside."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from datasets import Dataset
from transformers import AutoTokenizer

from hf_tinytx.tokenization import train_bpe_tokenizer
from hf_tinytx_training.data import token_store
from hf_tinytx_training.data.documents import MAX_DOCUMENT_CHARS, documents_of, file_sources, paragraphs
from hf_tinytx_training.data.packing import (
    GROUP,
    Blocks,
    PackedData,
    TokenStream,
    TrainingBlocks,
    make_dataloaders,
    read_tokens,
    split,
)
from hf_tinytx_training.errors import UserInputError
from tests.helpers.processes import descendants
from tests.helpers.reference import error_line
from tests.helpers.tiny import (
    LAUNCH,
    REPO_ROOT,
    WORDS,
    assert_same_weights,
    kill_after_call,
    pretrain_env,
    write_text,
)


PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
# A tiny model and a short run; the data flags come with each test.
FLAGS = [
    "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2",
    "--num_attention_heads", "4", "--vocab_size", "320", "--max_train_steps", "4", "--num_warmup_steps", "1",
    "--num_probes_per_kind", "0", "--num_samples", "0", "--max_train_seconds", "0",
    "--per_device_train_batch_size", "8",
]


def pretrain(tmp_path, *flags, launcher=None, timeout=600):
    command = [*(launcher or [sys.executable]), PRETRAIN, *FLAGS, *map(str, flags)]
    return subprocess.run(command, cwd=tmp_path, env=pretrain_env(tmp_path), capture_output=True, text=True,
                          timeout=timeout)


def ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def journal(store) -> list[dict]:
    return [json.loads(line) for line in (store / token_store.JOURNAL).read_text().splitlines()]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer([" ".join(WORDS)] * 50, 300)


# ----------------------------------------------------------------------------------------------------
# documents


def test_a_file_read_in_pieces_makes_the_documents_of_one_reading(tmp_path):
    text = write_text(tmp_path / "paragraphs.txt", 2.5)
    (source,) = file_sources([str(tmp_path / "paragraphs.txt")], "--train_file", "text", "text")
    assert len(source.pieces()) > 1  # pieces cut at blank lines, read by several processes
    assert list(documents_of([source])) == list(paragraphs([text]))


def test_json_lines_are_read_in_pieces_one_record_a_document(tmp_path):
    records = [{"text": line, "id": number} for number, line in enumerate(write_text(tmp_path / "t.txt", 2.5)
                                                                             .splitlines()) if line]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    (source,) = file_sources([str(tmp_path / "data.jsonl")], "--train_file", "json", "text")
    assert len(source.pieces()) > 1
    assert list(documents_of([source])) == [record["text"] for record in records]


def test_text_without_blank_lines_is_cut_into_bounded_documents(tmp_path):
    text = write_text(tmp_path / "lines.txt", 2.5, blank_lines=False)
    (source,) = file_sources([str(tmp_path / "lines.txt")], "--train_file", "text", "text")
    documents = list(documents_of([source]))
    assert len(documents) > 2.5e6 / MAX_DOCUMENT_CHARS  # never one document for the whole file
    assert all(len(document) <= MAX_DOCUMENT_CHARS and document.endswith("\n") for document in documents)
    assert "".join(documents) == text  # cut at line breaks, nothing lost
    assert [len(d) for d in paragraphs(["x" * 100], limit=40)] == [40, 40, 20]  # a line longer than the bound


# ----------------------------------------------------------------------------------------------------
# the store


def test_the_store_holds_the_tokenizers_ids_and_a_second_build_tokenizes_nothing(tmp_path, tokenizer):
    for number in range(3):
        write_text(tmp_path / f"part{number}.txt", 0.4 if number else 1.5, seed=number)
    sources = file_sources(sorted(map(str, tmp_path.glob("part*.txt"))), "--train_file", "text", "text")
    said = []
    shards = token_store.build(str(tmp_path / "store"), tokenizer, None, sources, 2, said.append)
    assert said[0].startswith(f"Tokenizing {sum(len(s.pieces()) for s in sources)} piece(s)") and \
        said[0].endswith("with 2 process(es)..."), said
    ids = tokenizer(list(documents_of(sources)), add_special_tokens=False)["input_ids"]
    expected = [token for document in ids for token in document + [tokenizer.eos_token_id]]
    stored = np.concatenate(
        [read_tokens(shard, 0, shard.tokens) for per_source in shards for shard in per_source]
    )
    assert stored.dtype == np.uint16 and stored.tolist() == expected
    assert not [name for name in os.listdir(tmp_path / "store") if name.startswith(".tmp-")]

    said.clear()
    again = token_store.build(str(tmp_path / "store"), tokenizer, None, sources, 2, said.append)
    assert said == [] and again == shards


def test_an_added_file_tokenizes_only_itself_and_a_changed_one_is_made_again(tmp_path, tokenizer):
    for number in range(3):
        write_text(tmp_path / f"part{number}.txt", 0.2, seed=number)
    store, said = tmp_path / "store", []
    files = lambda: sorted(map(str, tmp_path.glob("part*.txt")))  # noqa: E731
    token_store.build(str(store), tokenizer, None, file_sources(files(), "-", "text", "text"), 2, said.append)
    before = {entry["file"] for entry in journal(store)}

    write_text(tmp_path / "part3.txt", 0.2, seed=3)
    said.clear()
    token_store.build(str(store), tokenizer, None, file_sources(files(), "-", "text", "text"), 2, said.append)
    assert said[0].startswith("Tokenizing 1 piece(s)"), said  # the new file alone
    after = {entry["file"] for entry in journal(store)}
    assert before < after and len(after - before) == 1

    with open(tmp_path / "part1.txt", "a", encoding="utf-8") as f:
        f.write("One more paragraph at the end.\n")
    said.clear()
    token_store.build(str(store), tokenizer, None, file_sources(files(), "-", "text", "text"), 2, said.append)
    assert (
        said[0]
        == f"{tmp_path / 'part1.txt'} changed since it was tokenized (size or time): its shards are made "
        f"again."
    ), said
    assert said[1].startswith("Tokenizing 1 piece(s)")
    shards = sorted(name for name in os.listdir(store) if name.endswith(".bin"))
    # the old one is gone
    assert len(shards) == 4 and sorted(entry["file"] for entry in journal(store)) == shards


AGAIN = "its 1 shard(s) are removed and the data is tokenized again."


@pytest.mark.parametrize("change, line", [
    ("another tokenizer", f"holds tokens made with another tokenizer: {AGAIN}"),
    ("no header", f"has no readable store.json: {AGAIN}"),
    ("a broken header", f"has no readable store.json: {AGAIN}"),
])
def test_a_store_of_other_tokens_or_without_its_header_is_made_again_never_read(
    tmp_path, tokenizer, change, line,
):
    """Before (issue 69), a store without its header kept the old tokenizer's shards, labelled with the new
    tokenizer; another tokenizer's store was (and is) emptied in one line."""
    write_text(tmp_path / "a.txt", 0.2)
    sources = file_sources([str(tmp_path / "a.txt")], "--train_file", "text", "text")
    store = tmp_path / "store"
    token_store.build(str(store), tokenizer, None, sources, 1, print)
    if change == "no header":
        (store / "store.json").unlink()
    elif change == "a broken header":
        (store / "store.json").write_text('{"format": ')
    other = train_bpe_tokenizer([" ".join(reversed(WORDS))] * 50, 280)
    said = []
    (shards,) = token_store.build(str(store), other, None, sources, 1, said.append)
    assert said[0] == f"The token store {store} {line}", said
    ids = other(list(documents_of(sources)), add_special_tokens=False)["input_ids"]
    assert read_tokens(shards[0], 0, shards[0].tokens).tolist() == [
        t for d in ids for t in d + [other.eos_token_id]
    ]


def test_a_store_removes_only_files_of_its_own_names_and_refuses_a_folder_of_others(tmp_path, tokenizer):
    """Before (issue 69): any folder was taken for a store, and every *.bin its journal did not list and every
    .tmp-* entry went, with no word: a nanoGPT train.bin kept there was deleted."""
    write_text(tmp_path / "a.txt", 0.2)
    sources = file_sources([str(tmp_path / "a.txt")], "--train_file", "text", "text")
    nanogpt = tmp_path / "nanogpt"
    nanogpt.mkdir()
    (nanogpt / "train.bin").write_bytes(b"x")
    with pytest.raises(UserInputError) as refused:
        token_store.build(str(nanogpt), tokenizer, None, sources, 1, print)
    assert str(refused.value) == (
        f"{nanogpt} is not a token store (it has no store.json) and holds other files (train.bin): give "
        "--token_store a new or empty folder."
    )
    assert os.listdir(nanogpt) == ["train.bin"]

    store = tmp_path / "store"
    token_store.build(str(store), tokenizer, None, sources, 1, print)
    (store / "train.bin").write_bytes(b"x")  # a user's files kept in a store
    (store / ".tmp-notes").mkdir()
    (store / ".tmp-notes" / "notes.txt").write_text("mine")
    stray = store / f"a-{'0' * 16}-00000.bin"  # a killed build's shard, renamed but never recorded
    stray.write_bytes(b"")
    other = train_bpe_tokenizer([" ".join(reversed(WORDS))] * 50, 280)
    token_store.build(str(store), other, None, sources, 1, print)  # another tokenizer: the store is emptied
    assert (store / "train.bin").read_bytes() == b"x"
    assert (store / ".tmp-notes" / "notes.txt").read_text() == "mine" and not stray.exists()


def test_a_damaged_shard_is_made_again_in_one_line(tmp_path, tokenizer):
    """Before (issue 69): a shard overwritten with zeros at its size was read without notice."""
    write_text(tmp_path / "a.txt", 0.2)
    sources = file_sources([str(tmp_path / "a.txt")], "--train_file", "text", "text")
    store = tmp_path / "store"
    ((shard,),) = token_store.build(str(store), tokenizer, None, sources, 1, print)
    written = open(shard.path, "rb").read()
    with open(shard.path, "r+b") as f:
        f.write(bytes(len(written)))
    said = []
    assert token_store.build(str(store), tokenizer, None, sources, 1, said.append) == [[shard]]
    assert said[0] == (
        f"The shard {shard.path} of the token store is damaged (its checksum differs from the one recorded "
        "when it was written): it is made again."
    ), said
    assert said[1].startswith("Tokenizing 1 piece(s)") and open(shard.path, "rb").read() == written


def test_blocks_read_across_shards_the_training_documents_in_order(tmp_path, tokenizer):
    """Which shard and which offset: blocks over two files' shards, the held-out documents skipped."""
    for number in range(2):
        write_text(tmp_path / f"part{number}.txt", 0.05, seed=number)
    sources = file_sources(sorted(map(str, tmp_path.glob("part*.txt"))), "--train_file", "text", "text")
    shards = [shard for per_source in token_store.build(str(tmp_path / "store"), tokenizer, None, sources, 1,
                                                        print) for shard in per_source]
    data = split(shards, None, 20, None)
    documents = list(documents_of(sources))
    ids = tokenizer(documents, add_special_tokens=False)["input_ids"]
    held = [number < -(-len(documents) // 5) for number in range(len(documents))]  # the first 20%, rounded up
    kept = [
        token for document, out in zip(ids, held) if not out for token in document + [tokenizer.eos_token_id]
    ]
    blocks = Blocks(data.train, 16)
    assert len(shards) == 2 and len(blocks) == len(kept) // 16 > 100
    assert np.concatenate(list(blocks)).tolist() == kept[: len(blocks) * 16]


def test_validation_is_held_out_per_group_of_documents(tmp_path, tokenizer):
    def held_out(count: int) -> int:
        documents = [f"document {i}" for i in range(count)]
        ids = [np.array(tokenizer(d)["input_ids"] + [2], np.uint16) for d in documents]
        ends = np.cumsum([len(i) for i in ids]).astype(np.uint32)
        shard = token_store.Shard(None, int(ends[-1]), count, 0, "<u2",
                                  (np.concatenate(ids), ends, np.ones(count, np.uint32)))
        data = split([shard], None, 5, None)
        return data.validation_bytes  # one byte a document here

    assert held_out(1) == 0  # a single document: fit.py validates on its end instead
    assert held_out(12) == 1  # a page of paragraphs keeps one
    assert held_out(2 * GROUP + 500) == 50 + 50 + 25  # 5% of each group, rounded up


def test_progress_in_a_log_is_a_line_with_the_rate_and_the_time_left():
    import io

    from hf_tinytx_training.data.progress import Progress

    said = []
    # not a terminal: no bar
    progress = Progress(200_000_000, "Tokenizing", said.append, stream=io.StringIO())
    progress.started -= 10  # as if it began 10 s ago, and its last line came 20 s ago
    progress.last_line -= 20
    progress.update(50_000_000)
    assert said == ["Tokenizing: 50.0 MB of 200.0 MB (25%), 5.0 MB/s, 30 s left"]
    progress.update(60_000_000)  # within the interval: no line
    assert len(said) == 1


# ---------------------------------------------------------------------------------------------------- runs


def test_the_default_evaluation_reads_a_bounded_number_of_tokens_said_in_the_card(tmp_path):
    write_text(tmp_path / "text.txt", 0.5)
    out = tmp_path / "out"
    ok(
        pretrain(
            tmp_path, "--train_file", "text.txt", "--validation_split_percentage", 50, "--output_dir", out
        )
    )
    final = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"final"' in line
    ][0]
    # --max_eval_tokens 65536: 512 blocks of 128 (127 targets)
    assert final["eval_tokens"] == 65536 // 128 * 127
    card = (out / "README.md").read_text()
    assert re.search(
        r"On 65,024 held-out tokens: 512 blocks of 128, spread evenly over the [\d,]+ blocks of the "
        r"validation text \(an evaluation reads at most 65,536 tokens: `--max_eval_tokens`\):",
        card,
    ), card


def test_local_files_stream_with_a_shuffle_buffer(tmp_path):
    write_text(tmp_path / "text.txt", 0.3)
    out = tmp_path / "out"
    said = ok(pretrain(tmp_path, "--train_file", "text.txt", "--streaming", "--output_dir", out))
    assert "Tokenizing" not in said and not (out / "token_store").exists()  # nothing tokenized ahead
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [1, 2, 3, 4]
    assert [row for row in rows if row.get("final") and row["eval_tokens"] > 0]


@pytest.mark.deep
def test_a_streamed_run_resumes_bit_for_bit(tmp_path):
    write_text(tmp_path / "text.txt", 0.3)
    flags = ["--train_file", "text.txt", "--streaming", "--max_train_steps", 6, "--checkpointing_steps", 3]
    ok(pretrain(tmp_path, *flags, "--output_dir", "straight"))
    killed = pretrain(tmp_path, *flags, "--output_dir", "out",
                      launcher=kill_after_call("accelerate.Accelerator.save_state", nth=1))
    assert killed.returncode == -9, killed.stderr[-2000:]
    ok(pretrain(tmp_path, *flags, "--output_dir", "out", "--resume_from_checkpoint", "latest"))
    assert_same_weights(tmp_path / "straight", tmp_path / "out")


@pytest.mark.deep
def test_a_kill_during_tokenization_resumes_from_the_last_shard(tmp_path):
    write_text(tmp_path / "text.txt", 6)  # 6 pieces of 1 MiB
    flags = ["--train_file", "text.txt", "--preprocessing_num_workers", 1]
    killed = pretrain(
        tmp_path, *flags, "--output_dir", "out",
        launcher=kill_after_call("hf_tinytx_training.data.token_store.TokenStore.record", nth=2),
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = tmp_path / "out" / "token_store"
    assert len(journal(store)) == 2
    said = ok(pretrain(tmp_path, *flags, "--output_dir", "out"))
    assert "Reusing the tokenizer trained for this data" in said  # not trained again
    assert re.search(r"^Tokenizing 4 piece\(s\)", said, re.M), said  # 6 - the 2 finished
    # the killed worker's, removed
    assert not [name for name in os.listdir(store) if name.startswith(".tmp-")]

    ok(pretrain(tmp_path, *flags, "--output_dir", "straight"))  # the same text, tokenized without a kill
    straight = tmp_path / "straight" / "token_store"
    for entry in journal(store):
        assert (store / entry["file"]).read_bytes() == (straight / entry["file"]).read_bytes()
    assert_same_weights(tmp_path / "straight", tmp_path / "out")


@pytest.mark.deep
def test_a_store_in_use_is_never_emptied_by_a_run_of_another_tokenizer(tmp_path):
    """Before (issue 69): the second run emptied the store and made its shards again under the same names,
    while the first trained on them: the first read the other tokenizer's ids."""
    write_text(tmp_path / "text.txt", 0.3)
    train_bpe_tokenizer([" ".join(reversed(WORDS))] * 50, 280).save_pretrained(tmp_path / "other")
    store, flags = tmp_path / "store", ["--train_file", "text.txt", "--token_store", "store"]
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([sys.executable, PRETRAIN, *FLAGS, *flags, "--output_dir", "first"],
                                 cwd=tmp_path, env=pretrain_env(tmp_path, PYTHONUNBUFFERED="1"), stdout=log,
                                 stderr=subprocess.STDOUT)
    try:
        said = wait_for_line(first, tmp_path / "first.log", r"training and [\d,]+ validation blocks")
        os.kill(first.pid, signal.SIGSTOP)  # the first run holds its data, as one that trains for days
        shards = {path.name: path.read_bytes() for path in store.glob("*.bin")}
        second = pretrain(tmp_path, *flags, "--tokenizer_name", "other", "--output_dir", "second")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2
    assert error_line(second, "pretrain") == (
        f"pretrain.py: error: The token store {store} is in use by another run and holds tokens made with "
        "another tokenizer: give this run another --token_store, or run it once the other has ended."
    )
    assert shards and {path.name: path.read_bytes() for path in store.glob("*.bin")} == shards
    assert first.wait(timeout=300) == 0, said + (tmp_path / "first.log").read_text()[-3000:]
    assert not (tmp_path / "second").exists()


@pytest.mark.deep
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_tokenizing_process_ends_the_run_in_one_line_and_the_rerun_goes_on(tmp_path):
    """Before (issue 69): a worker killed (as the out-of-memory killer does) left the main process waiting
    forever at "Tokenizing ... (100%)"."""
    write_text(tmp_path / "text.txt", 8)  # 8 pieces of 1 MiB
    flags = ["--train_file", "text.txt", "--preprocessing_num_workers", 2, "--output_dir", "out"]
    command = [sys.executable, PRETRAIN, *FLAGS, *map(str, flags)]
    with open(tmp_path / "killed.log", "w") as log, open(tmp_path / "killed.err", "w") as err:
        run = subprocess.Popen(command, cwd=tmp_path, env=pretrain_env(tmp_path, PYTHONUNBUFFERED="1"),
                               stdout=log, stderr=err)
    try:
        wait_for_line(run, tmp_path / "killed.log", r"^Tokenizing \d+ piece")
        deadline = time.monotonic() + 30
        while len(workers := descendants(run.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(workers[0], signal.SIGKILL)
        started = time.monotonic()
        run.wait(timeout=60)  # before: forever
    finally:
        run.kill()
    print(f"the run ended {time.monotonic() - started:.1f} s after the kill")
    killed = subprocess.CompletedProcess(command, run.returncode, "", (tmp_path / "killed.err").read_text())
    assert run.returncode == 1
    assert "ended abruptly" in error_line(killed, "pretrain", "run the same command again")

    ok(pretrain(tmp_path, *flags))
    store = tmp_path / "out" / "token_store"
    tokenizer = AutoTokenizer.from_pretrained(store / token_store.TOKENIZER_DIR)
    sources = file_sources([str(tmp_path / "text.txt")], "--train_file", "text", "text")
    (clean,) = token_store.build(str(tmp_path / "clean"), tokenizer, None, sources, 1, print)
    entries = sorted(journal(store), key=lambda entry: entry["piece"])
    assert [(store / entry["file"]).read_bytes() for entry in entries] == [
        open(shard.path, "rb").read() for shard in clean
    ]


def wait_for_line(process, log, pattern: str, timeout: float = 300) -> str:
    """The log of `process` once a line matches `pattern`."""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, said := log.read_text(), re.M):
        assert process.poll() is None and time.monotonic() < deadline, said[-3000:]
        time.sleep(0.05)
    return said


@pytest.mark.deep
def test_two_ranks_share_one_tokenization(tmp_path):
    write_text(tmp_path / "text.txt", 3)
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", LAUNCH,
        "--hash-weights", str(tmp_path / "weights"),
    ]
    command = [*torchrun, PRETRAIN, *FLAGS, "--train_file", "text.txt", "--output_dir", "out"]
    result = subprocess.run(command, cwd=tmp_path, env=pretrain_env(tmp_path, OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=600)
    said = ok(result)
    assert len(re.findall(r"^Tokenized \d+ piece\(s\)", said, re.M)) == 1, said  # by the main process alone
    assert "Process 1" not in said  # it waits in silence: one voice a launch
    store = tmp_path / "out" / "token_store"
    assert len(journal(store)) == len({entry["file"] for entry in journal(store)})  # each piece once
    ranks = [json.loads((tmp_path / f"weights.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["sha256"] == ranks[1]["sha256"]
    # the handoff, gone
    assert not [name for name in os.listdir(tmp_path / "out") if name.startswith(".data-")]


@pytest.mark.deep
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_text_without_blank_lines_trains_in_bounded_memory(tmp_path):
    """Before: one 20 MB document, +150 MiB a MB of text (issue 55). Now
    documents of at most 64K characters."""
    write_text(tmp_path / "lines.txt", 20, blank_lines=False)
    command = [sys.executable, PRETRAIN, *FLAGS, "--train_file", "lines.txt", "--output_dir", "out"]
    process = subprocess.Popen(command, cwd=tmp_path, env=pretrain_env(tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    peak = 0
    while process.poll() is None:
        peak = max(peak, high_water_mark(process.pid))
        time.sleep(0.2)
    said = process.stdout.read()
    assert process.returncode == 0, said[-3000:]
    print(f"peak RSS of the main process: {peak / 2**20:.0f} MiB")
    assert peak < 1.5 * 2**30, f"{peak / 2**20:.0f} MiB"  # a 20 MB document alone took ~3 GiB
    assert "Validation: the last" not in said  # documents held out: the text was cut into documents


def high_water_mark(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


# ---------------------------------------------------------------------------------------------------- blocks


def blocks_of(tokens: list[int], block_size: int) -> Blocks:
    """`tokens` as one document held in memory, cut into blocks."""
    arrays = (np.array(tokens, dtype="<u2"), np.array([len(tokens)], np.uint32), np.zeros(1, np.uint32))
    shard = token_store.Shard(None, len(tokens), 1, 0, "<u2", arrays)
    return Blocks(TokenStream([shard], [(0, 0, len(tokens))]), block_size)


def test_each_epoch_cuts_the_token_stream_elsewhere_and_repeats_for_a_seed():
    stream = list(range(5 * 8))  # five packed blocks of 8 tokens
    blocks = TrainingBlocks(blocks_of(stream, 8), seed=0, take=5)

    blocks.set_epoch(0)  # the first pass reads the blocks as packed, in its own order
    assert sorted(blocks.order.tolist()) == [0, 1, 2, 3, 4] and blocks.shift == 0
    assert [blocks[i]["input_ids"].tolist() for i in range(5)] == [
        stream[b * 8 : b * 8 + 8] for b in blocks.order
    ]

    shifts, orders = set(), set()
    for epoch in range(1, 6):
        blocks.set_epoch(epoch)
        shift, order = blocks.shift, blocks.order.tolist()
        assert 1 <= shift < 8 and sorted(order) == [0, 1, 2, 3, 4]
        shifts.add(shift)
        orders.add(tuple(order))
        # the last wraps around
        expected = [(stream + stream)[b * 8 + shift : b * 8 + shift + 8] for b in order]
        batch = torch.utils.data.default_collate(blocks.__getitems__([3, 0, 4]))["input_ids"]
        assert batch.tolist() == [expected[3], expected[0], expected[4]]
        assert blocks[4]["input_ids"].tolist() == expected[4]
        again = TrainingBlocks(blocks_of(stream, 8), seed=0, take=5)
        again.set_epoch(epoch)  # a resumed run: order and shift are a function of (seed, epoch) alone
        assert (again.shift, again.order.tolist()) == (shift, order)
    assert len(shifts) > 1 and len(orders) > 1


def test_the_prepared_loaders_read_each_epoch_shifted_and_the_validation_spread_evenly():
    """Wired as pretrain.py wires them: Accelerate's loaders, told the epoch; a
    whole number of steps an epoch."""
    stream = list(range(7 * 4))  # seven packed blocks of 4 tokens: one is left for the next epoch's order
    train = blocks_of(stream, 4)
    packed = PackedData(train=train, validation=blocks_of(list(range(100, 140)), 4), bytes_per_token=1.0)
    args = SimpleNamespace(per_device_train_batch_size=2, per_device_eval_batch_size=2, max_eval_batches=None,
                           max_eval_tokens=12)  # three blocks of the validation's ten
    loader, evaluation = Accelerator(cpu=True).prepare(
        *make_dataloaders(packed, args, seed=3, global_batch=2)
    )
    epochs = []
    for epoch in (0, 1, 2):
        loader.set_epoch(epoch)
        epochs.append([row for batch in loader for row in batch["input_ids"].tolist()])
        shift, order = loader.dataset.shift, loader.dataset.order.tolist()
        assert (shift == 0) == (epoch == 0) and len(order) == 6 and len(set(order)) == 6
        assert epochs[-1] == [(stream + stream)[b * 4 + shift : b * 4 + shift + 4] for b in order]
    assert len({tuple(map(tuple, rows)) for rows in epochs}) == 3

    resumed, _ = Accelerator(cpu=True).prepare(*make_dataloaders(packed, args, seed=3, global_batch=2))
    resumed.set_epoch(2)
    assert [row for batch in resumed for row in batch["input_ids"].tolist()] == epochs[2]
    rows = [row for batch in evaluation for row in batch["input_ids"].tolist()]
    assert rows == [list(range(100 + b * 4, 104 + b * 4)) for b in (0, 3, 6)]  # every evaluation the same


def test_every_local_file_format_and_a_glob_read_the_same_documents(tmp_path):
    """.txt (a document a paragraph), .json, .jsonl, .parquet and a glob, for
    --train_file and --validation_file."""
    from hf_tinytx_training.data.sources import run_sources
    from hf_tinytx_training.pretrain_args import DataArguments

    documents = [f"Document {i} says one thing.\nAnd then another." for i in range(6)]
    train, validation = documents[:4], documents[4:]
    for name, docs in (("train", train), ("validation", validation)):
        (tmp_path / f"{name}.txt").write_text("\n\n".join(docs))  # a trailing newline would end the last one
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
        (tmp_path / f"{name}.json").write_text(json.dumps([{"text": doc} for doc in docs]))
        Dataset.from_dict({"text": docs}).to_parquet(tmp_path / f"{name}.parquet")
    (tmp_path / "parts").mkdir()
    for i, doc in enumerate(train):  # one document a file, matched by a glob
        (tmp_path / "parts" / f"part-{i}.jsonl").write_text(json.dumps({"text": doc}) + "\n")

    for train_file in ("train.txt", "train.jsonl", "train.json", "train.parquet", "parts/part-*.jsonl"):
        validation_file = train_file.replace("parts/part-*", "validation")
        data_args = DataArguments(
            train_file=str(tmp_path / train_file),
            validation_file=str(tmp_path / validation_file.replace("train", "validation")),
        )
        sources = run_sources(data_args, seed=0)
        assert list(documents_of(sources.train)) == train, train_file
        assert list(documents_of(sources.validation)) == validation, train_file


def test_a_handoff_folder_in_use_is_never_removed_by_another_start(tmp_path):
    """Two runs started on one --output_dir at once: the second's start removed the first's handoff folder,
    which then failed with FileNotFoundError (exit 1) instead of being refused when it claimed the folder."""
    from hf_tinytx_training.data import handoff

    running, killed, older = (tmp_path / f"{handoff.PREFIX}{name}" for name in ("running", "killed", "older"))
    held = handoff.hold(str(running) + handoff.LOCK_SUFFIX)  # as a running launch holds it
    running.mkdir()
    os.close(handoff.hold(str(killed) + handoff.LOCK_SUFFIX))  # a killed launch's lock is free
    killed.mkdir()
    older.mkdir()  # an older version's, without a lock file
    orphan = tmp_path / f"{handoff.PREFIX}gone{handoff.LOCK_SUFFIX}"  # killed between its two removals
    os.close(handoff.hold(str(orphan)))
    (tmp_path / "notes.txt").write_text("mine")
    handoff.remove_abandoned(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [running.name, running.name + handoff.LOCK_SUFFIX, "notes.txt"]
    os.close(held)
    handoff.remove_abandoned(str(tmp_path))
    assert os.listdir(tmp_path) == ["notes.txt"]
