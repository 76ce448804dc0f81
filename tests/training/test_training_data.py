"""The training blocks: each epoch a new random order and new cuts through the same token stream."""

import json
from types import SimpleNamespace

import numpy as np
import torch
from accelerate import Accelerator
from datasets import Dataset

from hf_tinytx_training.data.packing import EpochShuffleSampler, PackedData, ShiftingBlocks, make_dataloaders
from hf_tinytx_training.data.streams import Blocks, TokenStream
from hf_tinytx_training.data.token_store import Shard


def blocks_of(tokens: list[int], block_size: int) -> Blocks:
    """`tokens` as one document held in memory, cut into blocks."""
    arrays = (np.array(tokens, dtype="<u2"), np.array([len(tokens)], np.uint32), np.zeros(1, np.uint32))
    shard = Shard(None, len(tokens), 1, 0, "<u2", arrays)
    return Blocks(TokenStream([shard], [(0, 0, len(tokens))]), block_size)


def test_each_epoch_cuts_the_token_stream_elsewhere_and_repeats_for_a_seed():
    stream = list(range(5 * 8))  # five packed blocks of 8 tokens
    packed = blocks_of(stream, 8)
    blocks = ShiftingBlocks(packed, seed=0)
    sampler = EpochShuffleSampler(len(blocks), seed=0, blocks=blocks)

    sampler.set_epoch(0)  # the first pass reads the blocks as packed
    assert [blocks[i]["input_ids"].tolist() for i in range(5)] == [stream[i : i + 8] for i in range(0, 40, 8)]

    shifts = set()
    for epoch in range(1, 6):
        sampler.set_epoch(epoch)
        shift = blocks.shift
        assert 1 <= shift < 8
        shifts.add(shift)
        expected = [(stream + stream)[i * 8 + shift : i * 8 + shift + 8] for i in range(5)]  # the last wraps around
        batch = torch.utils.data.default_collate(blocks.__getitems__([3, 0, 4]))["input_ids"]
        assert batch.tolist() == [expected[3], expected[0], expected[4]]
        assert blocks[4]["input_ids"].tolist() == expected[4]
        again = ShiftingBlocks(packed, seed=0)
        again.set_epoch(epoch)  # a resumed run: the shift is a function of (seed, epoch) alone
        assert again.shift == shift
    assert len(shifts) > 1


def test_the_prepared_training_loader_reads_each_epoch_shifted():
    """Wired as pretrain.py wires it: Accelerate's loader, told the epoch (see epoch_batches), cuts that epoch's blocks
    at its shift, in that epoch's order."""
    stream = list(range(6 * 4))  # six packed blocks of 4 tokens
    train = blocks_of(stream, 4)
    packed = PackedData(train=train, validation=train, bytes_per_token=1.0)
    args = SimpleNamespace(per_device_train_batch_size=2, per_device_eval_batch_size=2, max_eval_batches=None,
                           max_eval_tokens=0)
    sampler, loader, _ = make_dataloaders(packed, args, seed=3)
    loader = Accelerator(cpu=True).prepare(loader)
    for epoch in (0, 1, 2):
        loader.set_epoch(epoch)
        rows = [row for batch in loader for row in batch["input_ids"].tolist()]
        shift = sampler.blocks.shift
        assert (shift == 0) == (epoch == 0)
        expected = [(stream + stream)[i * 4 + shift : i * 4 + shift + 4] for i in range(6)]
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert rows == [expected[i] for i in order]


def test_every_local_file_format_and_a_glob_read_the_same_documents(tmp_path):
    """--train_file takes .txt (one document per paragraph), .json, .jsonl and .parquet, and a glob over several
    files; --validation_file the same. Each reads the same documents."""
    from hf_tinytx_training.args import DataArguments
    from hf_tinytx_training.data.documents import documents_of
    from hf_tinytx_training.data.sources import run_sources

    documents = [f"Document {i} says one thing.\nAnd then another." for i in range(6)]
    train, validation = documents[:4], documents[4:]
    for split, docs in (("train", train), ("validation", validation)):
        (tmp_path / f"{split}.txt").write_text("\n\n".join(docs))  # a trailing newline would end the last one
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
        (tmp_path / f"{split}.json").write_text(json.dumps([{"text": doc} for doc in docs]))
        Dataset.from_dict({"text": docs}).to_parquet(tmp_path / f"{split}.parquet")
    (tmp_path / "parts").mkdir()
    for i, doc in enumerate(train):  # one document a file, matched by a glob
        (tmp_path / "parts" / f"part-{i}.jsonl").write_text(json.dumps({"text": doc}) + "\n")

    for train_file in ("train.txt", "train.jsonl", "train.json", "train.parquet", "parts/part-*.jsonl"):
        validation_file = train_file.replace("parts/part-*", "validation")
        data_args = DataArguments(train_file=str(tmp_path / train_file),
                                  validation_file=str(tmp_path / validation_file.replace("train", "validation")))
        sources = run_sources(data_args, seed=0)
        assert list(documents_of(sources.train)) == train, train_file
        assert list(documents_of(sources.validation)) == validation, train_file
