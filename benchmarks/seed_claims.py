"""The seeds' claims, demonstrated and measured: attention you can see, and why it beat reading one token at a time.

The two explainer texts the project started from make six checkable claims. This script measures each one on this
machine and writes a report: a table of claims (what the seeds say, what was measured here), the detail tables
and the figures.

    python benchmarks/seed_claims.py                    # ~10 minutes on a quiet 2-core CPU
    python benchmarks/seed_claims.py --quick            # everything at toy scale, under two minutes
    python benchmarks/seed_claims.py --model out/tiny   # claims 4 and 6 on a model trained by training/pretrain.py
    python benchmarks/seed_claims.py --lookup_steps 1500 --train_steps 500   # budgets in steps, not seconds

1. Twice the window, about four times the looking work: one attention layer timed at n and 2n (attention_scaling).
2. Token 50 waits for token 49: training tokens/s of TinyTx and of an LSTM with about as many parameters, how each
   one's step time grows with sequence length, and, one sequence per step, where TinyTx overtakes the LSTM as the
   sequence grows and cores are added.
3. A fact from word 1 hardly survives to word 200: TinyTx and an LSTM of as many parameters trained for the same
   time on a lookup task of the MQAR kind ("Zoology", Arora et al., 2023: key-value pairs first, questions for the
   keys later) and on copying, then asked at exact distances from 12 to 400 tokens.
4. "...because it was too tired": TinyTx's accuracy at resolving "it", and the map of its best "it" head.
5. Attention alone ignores order; rotary positions make scores depend on separation only (numerical checks).
6. Different heads specialise: the best heads per role in the trained models (the lookup head of claim 3's model
   among them, with its map), against the same models untrained.

Writes REPORT.md, results.json and PNGs to --out (default benchmarks/results/seed_claims/). Prints the claims table,
then, last, one JSON line with the figures.
"""

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch


HERE = Path(__file__).resolve().parent

from attention_scaling import attention_flops, time_interleaved  # noqa: E402  (siblings in benchmarks/)
from common import count_parameters, interleaved_medians  # noqa: E402
from lstm_baseline import lstm_matching  # noqa: E402

from hf_tinytx import TinyTxConfig, TinyTxForCausalLM  # noqa: E402
from hf_tinytx.corpus import default_corpus, make_probes  # noqa: E402
from hf_tinytx.interpret import (  # noqa: E402
    attention_maps,
    attention_weights,
    coref_head_scores,
    find_heads,
    induction_baseline,
    induction_targets,
    permutation_check,
    render_attention_map,
    rotary_separation_check,
    uniform_baseline,
)
from hf_tinytx.probes import score_probes  # noqa: E402


# Everything that differs between --quick and the full run.
SETTINGS = {
    "full": dict(
        scaling_lengths=(512, 1024, 2048), scaling_hidden=256, scaling_heads=4, scaling_repeats=5,
        step_lengths=(64, 128, 256, 512), step_batch=8, step_repeats=5, single_lengths=(64, 128, 256, 512, 1024),
        # Claims 4 and 6, on the corpus: ~0.66M parameters, 2 layers (the fewest that can chain "find the earlier
        # mention" and "copy what followed"). lr 1e-3: at 3e-3 the copying circuit did not form (tried).
        model=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4),
        vocab_size=1024, num_documents=30000, block_size=512, batch_size=8, train_seconds=150.0, lr=1e-3,
        probes_per_kind=50, head_texts=16,
        # Claim 3, the lookup task: 16 pairs as in Zoology's smaller settings; width 64 (~150k parameters) is where
        # Zoology's two-layer attention already solves MQAR, and it keeps a step at 512 tokens under a second.
        lookup_task=dict(num_pairs=16, num_keys=64, num_values=64, num_fillers=16),
        lookup_model=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4),
        lookup_stages=(("copy", 80), ("copy+lookup", 80), ("copy+lookup", 160), ("copy+lookup", 320),
                       ("copy+lookup", 512)),
        # lr 1e-2 with 100 warm-up steps: at 3e-3 TinyTx had started neither copying nor lookups after 800 steps;
        # the LSTM learnt neither at 1e-2, 3e-3 or 1e-3 in 500 steps (tried).
        lookup_batch=32, lookup_lr=1e-2, lookup_warmup=100, lookup_seconds=200.0,
        lookup_distances=(12, 25, 50, 100, 200, 400), lookup_probes=64, map_distance=200,
    ),
    "quick": dict(
        scaling_lengths=(128, 256), scaling_hidden=64, scaling_heads=2, scaling_repeats=3,
        step_lengths=(32, 64), step_batch=4, step_repeats=3, single_lengths=(32, 64),
        model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        vocab_size=320, num_documents=300, block_size=128, batch_size=4, train_seconds=6.0, lr=3e-3,
        probes_per_kind=4, head_texts=3,
        lookup_task=dict(num_pairs=8, num_keys=32, num_values=32, num_fillers=8),
        lookup_model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        lookup_stages=(("copy", 48), ("copy+lookup", 48), ("copy+lookup", 96)),
        lookup_batch=8, lookup_lr=1e-2, lookup_warmup=10, lookup_seconds=6.0,
        lookup_distances=(12, 25, 50, 100, 200, 400), lookup_probes=4, map_distance=200,
    ),
}  # fmt: skip
EXAMPLE_SENTENCE = "The animal didn't cross the street because it was too tired. The"
LABELS = {"tinytx": "TinyTx", "lstm": "LSTM"}


# ---------------------------------------------------------------------------------------------------------------
# Data and models
# ---------------------------------------------------------------------------------------------------------------


def build_data(settings: dict, seed: int):
    """A BPE trained on the corpus, and the training split cut into (blocks, block_size) token ids."""
    from hf_tinytx.tokenization import train_bpe_tokenizer

    corpus = default_corpus(num_documents=settings["num_documents"], seed=seed)
    tokenizer = train_bpe_tokenizer([corpus["train"]], settings["vocab_size"], model_max_length=4096)
    stream = []
    for ids in tokenizer(corpus["train"], add_special_tokens=False)["input_ids"]:
        stream += ids + [tokenizer.eos_token_id]
    block = settings["block_size"]
    usable = len(stream) // block * block
    if usable == 0:
        raise ValueError(f"The corpus is shorter than one block of {block} tokens; use more documents.")
    blocks = torch.tensor(stream[:usable]).view(-1, block)
    return tokenizer, blocks, corpus["validation"]


def build_tinytx(settings: dict, tokenizer, seed: int) -> TinyTxForCausalLM:
    config = TinyTxConfig(
        vocab_size=len(tokenizer), max_position_embeddings=1024, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **settings["model"],
    )  # fmt: skip
    torch.manual_seed(seed)
    return TinyTxForCausalLM._from_config(config, attn_implementation="sdpa")


def build_pair(settings: dict, tokenizer, seed: int) -> dict[str, torch.nn.Module]:
    """TinyTx and the LSTM whose parameter count is closest to it, from the same seed."""
    tinytx = build_tinytx(settings, tokenizer, seed)
    torch.manual_seed(seed)
    lstm = lstm_matching(count_parameters(tinytx), len(tokenizer))
    return {"tinytx": tinytx, "lstm": lstm}


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def labelled_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of labelled tokens (labels != -100) that are the argmax of the logits one position earlier."""
    targets = labels[:, 1:]
    mask = targets != -100
    return (logits[:, :-1].argmax(-1)[mask] == targets[mask]).float().mean().item()


def training_step(model, optimizer, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """One update; returns the loss and the accuracy on the labelled tokens (which the curriculum watches)."""
    optimizer.zero_grad(set_to_none=True)
    output = model(input_ids=input_ids, labels=labels)
    output.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return output.loss.item(), labelled_accuracy(output.logits.detach(), labels)


def make_optimizer(model, lr: float):
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def scheduled_lr(peak: float, step: int, fraction_done: float, warmup_steps: int = 20) -> float:
    """Linear warm-up over the first steps, then linear decay to a tenth of the peak as the budget runs out.

    A budget in seconds makes the decay follow each model's own clock: both end their training at the same low
    rate however many steps their speed allowed."""
    return peak * min(1.0, (step + 1) / warmup_steps) * (1.0 - 0.9 * min(1.0, fraction_done))


@dataclass(frozen=True)
class Budget:
    """How long each model trains: seconds of its own step time, or a number of steps (reproducible on a busy
    machine, where seconds buy fewer steps)."""

    seconds: float | None = None
    steps: int | None = None

    def fraction(self, steps_done: int, seconds_done: float) -> float:
        return steps_done / self.steps if self.steps else seconds_done / self.seconds

    def describe(self) -> str:
        return f"{self.steps} steps" if self.steps else f"{self.seconds:.0f} s"


class CorpusFeed:
    """Blocks of the corpus in one seeded order, every token a label."""

    def __init__(self, blocks: torch.Tensor, batch_size: int, seed: int):
        self.blocks, self.batch_size = blocks, batch_size
        self.order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed))
        self.next_index = 0

    def batch(self, fraction_done: float) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.order[torch.arange(self.next_index, self.next_index + self.batch_size) % len(self.blocks)]
        self.next_index += self.batch_size
        return self.blocks[rows], self.blocks[rows]

    def record(self, accuracy: float) -> None:
        pass  # no curriculum on the corpus


def train_in_turns(models: dict, feeds: dict, budget: Budget, lr: float, warmup_steps: int = 20) -> dict:
    """Trains every model for the same budget, taking steps in turn (so a busy neighbour slows all of them alike),
    each on batches from its own feed. Returns per-model steps, tokens, seconds, tokens/s and final loss."""
    optimizers = {name: make_optimizer(model, lr) for name, model in models.items()}
    stats = {name: {"steps": 0, "seconds": 0.0, "tokens": 0, "losses": []} for name in models}
    for model in models.values():
        model.train()
    while any(budget.fraction(s["steps"], s["seconds"]) < 1.0 for s in stats.values()):
        for name, model in models.items():
            s = stats[name]
            done = budget.fraction(s["steps"], s["seconds"])
            if done >= 1.0:
                continue
            input_ids, labels = feeds[name].batch(done)
            for group in optimizers[name].param_groups:
                group["lr"] = scheduled_lr(lr, s["steps"], done, warmup_steps)
            start = time.perf_counter()
            loss, accuracy = training_step(model, optimizers[name], input_ids, labels)
            s["seconds"] += time.perf_counter() - start
            feeds[name].record(accuracy)
            s["steps"] += 1
            s["tokens"] += input_ids.numel()
            s["losses"].append(loss)
    for model in models.values():
        model.eval()
    return {
        name: {"steps": s["steps"], "tokens": s["tokens"], "seconds": s["seconds"],
               "tokens_per_s": s["tokens"] / s["seconds"], "final_loss": statistics.mean(s["losses"][-10:])}
        for name, s in stats.items()
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The lookup task of claim 3
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LookupTask:
    """A small synthetic vocabulary for long-range lookups: id 0 opens every sequence, then filler, key and value
    ids. No words: every labelled token is a lookup, and a filler never looks like a key."""

    num_pairs: int
    num_keys: int = 64
    num_values: int = 64
    num_fillers: int = 16

    @property
    def vocab_size(self) -> int:
        return 1 + self.num_fillers + self.num_keys + self.num_values

    @property
    def pairs_end(self) -> int:
        """Position right after the opening id and the key-value pairs."""
        return 1 + 2 * self.num_pairs

    def fillers(self, shape: tuple, generator) -> torch.Tensor:
        return 1 + torch.randint(0, self.num_fillers, shape, generator=generator)

    def pairs(self, batch: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values), each (batch, num_pairs): distinct keys per sequence, values drawn freely."""
        keys = torch.rand(batch, self.num_keys, generator=generator).argsort(-1)[:, : self.num_pairs]
        values = torch.randint(0, self.num_values, (batch, self.num_pairs), generator=generator)
        return 1 + self.num_fillers + keys, 1 + self.num_fillers + self.num_keys + values

    def items(self, batch: int, count: int, generator) -> torch.Tensor:
        """(batch, count) distinct key or value ids: the lists of the copy task."""
        pool = self.num_keys + self.num_values
        return 1 + self.num_fillers + torch.rand(batch, pool, generator=generator).argsort(-1)[:, :count]


def pairs_opening(task: LookupTask, keys, values, length: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of `length`: the opening id, k1 v1 k2 v2 ..., filler after; labels all -100 (nothing to learn)."""
    ids = task.fillers((keys.shape[0], length), generator)
    ids[:, 0] = 0
    ids[:, 1 : task.pairs_end : 2], ids[:, 2 : task.pairs_end : 2] = keys, values
    return ids, torch.full_like(ids, -100)


def lookup_batch(task: LookupTask, batch: int, length: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """MQAR: after the pairs, every key is asked once, in random order at random places, its value following; only
    the values asked for are labels, so every unit of loss is a lookup."""
    keys, values = task.pairs(batch, generator)
    ids, labels = pairs_opening(task, keys, values, length, generator)
    slots = (length - task.pairs_end) // 2  # a question takes two tokens: the key, then its value
    if slots < task.num_pairs:
        raise ValueError(f"{length} tokens leave no room for {task.num_pairs} questions after the pairs.")
    where = task.pairs_end + 2 * torch.rand(batch, slots, generator=generator).argsort(-1)[:, : task.num_pairs]
    rows = torch.arange(batch)[:, None]
    ids[rows, where], ids[rows, where + 1] = keys, values
    labels[rows, where + 1] = values
    return ids, labels


def copy_batch(task: LookupTask, batch: int, length: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Induction: a list of distinct ids, filler of random length, the list again; the repeat after its first id
    is labelled. The gap varies, so only "find the earlier copy of this id, read what followed" solves it."""
    count = task.num_pairs
    lists = task.items(batch, count, generator)
    ids = task.fillers((batch, length), generator)
    ids[:, 0], ids[:, 1 : 1 + count] = 0, lists
    where = 1 + count + torch.randint(0, length - 2 * count, (batch, 1), generator=generator) + torch.arange(count)
    rows = torch.arange(batch)[:, None]
    ids[rows, where] = lists
    labels = torch.full_like(ids, -100)
    labels[rows, where[:, 1:]] = lists[:, 1:]
    return ids, labels


def lookup_probes(task: LookupTask, count: int, distance: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` sequences whose every question stands exactly `distance` tokens after its key: half of the pairs
    for which that lands after the pairs, asked in the order of the pairs, filler in between."""
    keys, values = task.pairs(count, generator)
    key_positions = torch.arange(1, task.pairs_end, 2)
    fits = torch.nonzero(key_positions + distance >= task.pairs_end).flatten()
    if len(fits) == 0:
        raise ValueError(f"No key can be asked {distance} tokens later; distances must be >= 2.")
    asked = fits[torch.randperm(len(fits), generator=generator)[: max(1, len(fits) // 2)]].sort().values
    ids, labels = pairs_opening(task, keys, values, task.pairs_end + distance + 1, generator)
    where = key_positions[asked] + distance
    ids[:, where], ids[:, where + 1] = keys[:, asked], values[:, asked]
    labels[:, where + 1] = values[:, asked]
    return ids, labels


def copy_probes(task: LookupTask, count: int, distance: int, generator, list_length: int = 8):
    """`count` sequences with a list of `list_length` ids repeated exactly `distance` tokens later (filler between);
    the repeat after its first id is labelled."""
    if distance <= list_length:
        raise ValueError(f"A list of {list_length} ids cannot be repeated {distance} tokens later without overlap.")
    lists = task.items(count, list_length, generator)
    ids = task.fillers((count, 1 + distance + list_length), generator)
    ids[:, 0], ids[:, 1 : 1 + list_length], ids[:, 1 + distance :] = 0, lists, lists
    labels = torch.full_like(ids, -100)
    labels[:, 2 + distance :] = lists[:, 1:]
    return ids, labels


@dataclass
class Curriculum:
    """Copying first (the easier way into the same circuit: find the earlier copy, read what followed), then copying
    and lookups mixed on ever longer sequences. A model moves up a stage once it gets 90% of its answers right over
    20 steps, and is moved up anyway as its budget runs from 30% to 70%: every model ends at full length."""

    stages: tuple
    hold: float = 0.3
    full_at: float = 0.7
    earned: int = 0
    recent: list = field(default_factory=list)

    def stage(self, fraction_done: float) -> int:
        ramp = min(1.0, max(0.0, (fraction_done - self.hold) / (self.full_at - self.hold)))
        return max(self.earned, int(ramp * (len(self.stages) - 1)))

    def record(self, accuracy: float, fraction_done: float) -> None:
        self.recent = (self.recent + [accuracy])[-20:]
        if len(self.recent) == 20 and statistics.mean(self.recent) > 0.9 and self.earned < len(self.stages) - 1:
            self.earned, self.recent = self.stage(fraction_done) + 1, []


class LookupFeed:
    """Training batches of the lookup task for one model, following that model's own curriculum."""

    def __init__(self, task: LookupTask, stages: tuple, batch_size: int, seed: int):
        self.task, self.batch_size, self.curriculum = task, batch_size, Curriculum(stages)
        self.generator = torch.Generator().manual_seed(seed)
        self.done, self.served = 0.0, 0
        self.log = []  # (step, stage index) at the first step of each stage

    def batch(self, fraction_done: float) -> tuple[torch.Tensor, torch.Tensor]:
        self.done, stage = fraction_done, self.curriculum.stage(fraction_done)
        if not self.log or self.log[-1][1] != stage:
            self.log.append((self.served, stage))
        self.served += 1
        kind, length = self.curriculum.stages[stage]
        copies = self.batch_size if kind == "copy" else self.batch_size // 2
        parts = [copy_batch(self.task, copies, length, self.generator)]
        if copies < self.batch_size:
            parts.append(lookup_batch(self.task, self.batch_size - copies, length, self.generator))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def record(self, accuracy: float) -> None:
        self.curriculum.record(accuracy, self.done)


@torch.no_grad()
def probe_accuracy(model, input_ids: torch.Tensor, labels: torch.Tensor, batch_size: int = 16) -> float:
    """Accuracy over all labelled tokens of the probes (argmax over the whole vocabulary)."""
    model.eval()
    right = total = 0
    for start in range(0, len(input_ids), batch_size):
        ids, target = input_ids[start : start + batch_size], labels[start : start + batch_size]
        count = int((target[:, 1:] != -100).sum())
        right += labelled_accuracy(model(input_ids=ids).logits, target) * count
        total += count
    return right / total


# ---------------------------------------------------------------------------------------------------------------
# The claims
# ---------------------------------------------------------------------------------------------------------------


def claim_quadratic(settings: dict) -> dict:
    lengths = settings["scaling_lengths"]
    hidden, heads, repeats = settings["scaling_hidden"], settings["scaling_heads"], settings["scaling_repeats"]
    times = time_interleaved(lengths, hidden, heads, repeats)
    rows = []
    for n in lengths:
        rows.append({
            "n": n, "eager_ms": times["eager"][n] * 1e3, "sdpa_ms": times["sdpa"][n] * 1e3,
            "attention_gflop": attention_flops(n, settings["scaling_hidden"]) / 1e9,
        })  # fmt: skip
    growth = {
        backend: statistics.median(times[backend][2 * n] / times[backend][n] for n in lengths if 2 * n in lengths)
        for backend in ("eager", "sdpa")
    }
    flop_growth = attention_flops(2 * lengths[0], 1) / attention_flops(lengths[0], 1)
    return {"rows": rows, "time_growth_when_n_doubles": growth, "flop_growth_when_n_doubles": flop_growth}


def claim_sequential(settings: dict, tokenizer, seed: int) -> dict:
    """Step time (forward + backward + update) of both models at each sequence length, interleaved; then, with one
    sequence per step (nothing to spread over cores but its positions), tokens/s by length on one core and on all."""
    models = build_pair(settings, tokenizer, seed)
    optimizers = {name: make_optimizer(model, settings["lr"]) for name, model in models.items()}

    def step_medians(batch_size: int, length: int) -> dict[str, float]:
        batch = torch.randint(0, len(tokenizer), (batch_size, length), generator=torch.Generator().manual_seed(seed))
        runs = {name: (lambda m=model, o=optimizers[name]: training_step(m, o, batch, batch))
                for name, model in models.items()}  # fmt: skip
        return interleaved_medians(runs, repeats=settings["step_repeats"], warmup=1)

    batch_size = settings["step_batch"]
    rows = []
    for length in settings["step_lengths"]:
        medians = step_medians(batch_size, length)
        rows.append({"length": length, **{f"{name}_step_ms": t * 1e3 for name, t in medians.items()},
                     **{f"{name}_tokens_per_s": batch_size * length / t for name, t in medians.items()}})  # fmt: skip
    growth = {}
    for name in models:
        ratios = [b[f"{name}_step_ms"] / a[f"{name}_step_ms"] for a, b in zip(rows, rows[1:])
                  if b["length"] == 2 * a["length"]]  # fmt: skip
        growth[name] = statistics.median(ratios) if ratios else float("nan")

    # The seeds' point is about parallel hardware: attention's positions are independent work, the LSTM's are a
    # chain. One sequence per step leaves the positions as the only parallel work, so tokens/s by length and by
    # core count shows where, if anywhere, TinyTx overtakes the LSTM.
    threads_before, all_cores = torch.get_num_threads(), available_cores()
    load_before, single = os.getloadavg()[0], []
    for threads in sorted({1, all_cores}):
        torch.set_num_threads(threads)
        for length in settings["single_lengths"]:
            speeds = {f"{name}_tokens_per_s": length / t for name, t in step_medians(1, length).items()}
            single.append({"threads": threads, "length": length, **speeds})
    torch.set_num_threads(threads_before)
    return {
        "batch_size": batch_size,
        "threads": threads_before,
        "parameters": {name: count_parameters(model) for name, model in models.items()},
        "sequential_steps_per_layer": {"tinytx": 1, "lstm": "sequence length"},
        "rows": rows,
        "step_time_growth_when_length_doubles": growth,
        "single_sequence": {"cores": all_cores, "rows": single, "crossover": crossover_lengths(single),
                            "load_average": [load_before, os.getloadavg()[0]]},
    }  # fmt: skip


def crossover_lengths(single: list[dict]) -> dict[int, int | None]:
    """Per thread count, the shortest measured length from which on TinyTx reads at least as many tokens/s as the
    LSTM at every longer measured length (None: the LSTM is ahead at the longest)."""
    found = {}
    for threads in sorted({row["threads"] for row in single}):
        rows = [row for row in single if row["threads"] == threads]
        ahead = [row["tinytx_tokens_per_s"] >= row["lstm_tokens_per_s"] for row in rows]
        first = len(ahead)
        while first > 0 and ahead[first - 1]:
            first -= 1
        found[threads] = rows[first]["length"] if first < len(rows) else None
    return found


def build_lookup_pair(settings: dict, task: LookupTask, seed: int) -> dict[str, torch.nn.Module]:
    config = TinyTxConfig(vocab_size=task.vocab_size, max_position_embeddings=1024, bos_token_id=0, eos_token_id=0,
                          pad_token_id=0, **settings["lookup_model"])  # fmt: skip
    torch.manual_seed(seed)
    tinytx = TinyTxForCausalLM._from_config(config, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return {"tinytx": tinytx, "lstm": lstm_matching(count_parameters(tinytx), task.vocab_size)}


def claim_lookup(settings: dict, budget: Budget, seed: int) -> tuple[dict, dict, LookupTask]:
    """Both models trained for the same budget on the same curriculum, then asked at each exact distance (the same
    probes for both). Returns the results, the trained models and the task."""
    task = LookupTask(**settings["lookup_task"])
    models = build_lookup_pair(settings, task, seed)
    feeds = {name: LookupFeed(task, settings["lookup_stages"], settings["lookup_batch"], seed) for name in models}
    training = train_in_turns(models, feeds, budget, settings["lookup_lr"], settings["lookup_warmup"])
    for name, feed in feeds.items():
        training[name]["stages"] = [(step, *settings["lookup_stages"][i]) for step, i in feed.log]
        training[name]["parameters"] = count_parameters(models[name])
    rows = []
    for distance in settings["lookup_distances"]:
        generator = torch.Generator().manual_seed(seed + distance)
        probes = {"lookup": lookup_probes(task, settings["lookup_probes"], distance, generator),
                  "copy": copy_probes(task, settings["lookup_probes"], distance, generator)}  # fmt: skip
        rows.append({"distance": distance, **{f"{name}_{kind}": probe_accuracy(model, *probes[kind])
                                              for name, model in models.items() for kind in probes}})  # fmt: skip
    results = {"rows": rows, "training": training, "budget": budget.describe(), "task": vars(task),
               "chance": 1 / task.num_pairs, "probes_per_distance": settings["lookup_probes"]}  # fmt: skip
    return results, models, task


def claim_lookup_head(settings: dict, model, task: LookupTask, seed: int, out_dir: Path) -> dict:
    """The lookup head, found by the head search among all its roles on probes at the map's distance, against the
    same model untrained; and its attention at the questions of one probe."""
    distance = settings["map_distance"]
    ids, labels = lookup_probes(task, 4, distance, torch.Generator().manual_seed(seed + 7))
    sequences = [row.tolist() for row in ids]
    untrained = build_lookup_pair(settings, task, seed + 1)["tinytx"].eval()
    found = {"trained": find_heads(model, None, sequences, top=1),
             "untrained": find_heads(untrained, None, sequences, top=1)}  # fmt: skip
    even = {"previous_token": uniform_baseline(len(sequences[0])), "first_token": uniform_baseline(len(sequences[0])),
            "induction": statistics.mean(induction_baseline(s) for s in sequences)}  # fmt: skip
    rows = [{"role": role, "layer": best[0].layer, "head": best[0].head, "score": best[0].score,
             "untrained_best": found["untrained"][role][0].score, "even_spread": even[role]}
            for role, best in found["trained"].items()]  # fmt: skip
    lookup = next(row for row in rows if row["role"] == "induction")
    weights = attention_weights(model, ids)[lookup["layer"], :, lookup["head"]]  # (probes, n, n)
    questions = torch.nonzero(labels[0] != -100).flatten() - 1  # the same places in every probe of one call
    on_value = weights[:, questions, questions - distance + 1].mean().item()
    title = (f"layer {lookup['layer']}, head {lookup['head']}, the lookup head found: "
             f"questions {distance} tokens after their keys")  # fmt: skip
    save_figure(render_lookup_map(weights[0], labels[0], distance, title), out_dir / "lookup_head.png")
    return {"rows": rows, "distance": distance, "weight_on_value_at_questions": on_value, "map": "lookup_head.png"}


def claim_coref(settings: dict, model, tokenizer, out_dir: Path) -> dict:
    probes = make_probes(settings["probes_per_kind"], recall_distances=())
    coref_probes = [p for p in probes if p.kind in ("coref", "coref_new_nouns")]
    accuracy = score_probes(model, tokenizer, coref_probes, batch_size=16)
    maps = attention_maps(model, tokenizer, EXAMPLE_SENTENCE)
    heads = {}
    for query in ("it", "last"):
        scores = coref_head_scores(model, tokenizer, [p for p in coref_probes if p.kind == "coref"], query)
        flat = int(torch.argmax(scores["score"]))
        layer, head = divmod(flat, scores["score"].shape[1])
        png = out_dir / f"coref_head_{query}.png"
        where = "at 'it'" if query == "it" else "at the final 'The'"
        save_figure(render_attention_map(maps.weights[layer, head], maps.tokens,
                                         f"layer {layer}, head {head}: best referent head {where}"), png)  # fmt: skip
        heads[query] = {
            "layer": layer, "head": head, "score": float(scores["score"][layer, head]),
            "referent_weight": float(scores["referent"][layer, head]),
            "other_weight": float(scores["other"][layer, head]),
            "agreement": float(scores["agreement"][layer, head]), "map": png.name,
        }  # fmt: skip
    return {"coref": accuracy["coref"], "coref_new_nouns": accuracy["coref_new_nouns"], "chance": 0.5, "heads": heads}


def claim_positions() -> dict:
    permutation = permutation_check()
    separation = rotary_separation_check()
    return {
        "permutation_max_error_without_rope": permutation.max_error,
        "permutation_max_error_with_rope": permutation.contrast,
        "separation_max_error": separation.max_error,
        "score_change_when_one_token_moves": separation.contrast,
    }


def claim_heads(settings: dict, model, untrained, tokenizer, texts: list[str]) -> dict:
    probes = [p for p in make_probes(settings["probes_per_kind"], recall_distances=()) if p.kind == "coref"]
    # Short windows of real text: the positional roles are about neighbours, and short rows keep the baseline high.
    texts = [tokenizer.decode(tokenizer(text)["input_ids"][:48]) for text in texts]
    found = {"trained": find_heads(model, tokenizer, texts, probes, top=1)}
    found["untrained"] = find_heads(untrained, tokenizer, texts, probes, top=1)
    ids = [tokenizer(text)["input_ids"] for text in texts]
    uniform = statistics.mean(uniform_baseline(len(i)) for i in ids)
    repeating = [i for i in ids if len(induction_targets(i)[0])]
    even = {"previous_token": uniform, "first_token": uniform,
            "induction": statistics.mean(induction_baseline(i) for i in repeating) if repeating else 0.0}  # fmt: skip
    rows = []
    for role in found["trained"]:
        best, random_best = found["trained"][role][0], found["untrained"][role][0]
        rows.append({"role": role, "layer": best.layer, "head": best.head, "score": best.score,
                     "untrained_best": random_best.score, "even_spread": even.get(role, 0.0)})  # fmt: skip
    return {"rows": rows, "texts": len(texts)}


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_lines(x, series: dict, xlabel: str, ylabel: str, title: str, path: Path, logx=False, hline=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in series.items():
        ax.plot(x, values, "o-", label=label)
    if hline is not None:
        ax.axhline(hline[0], color="k", linestyle=":", label=hline[1])
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_lookup_curves(d: dict, path: Path) -> None:
    """Accuracy against distance: one colour per model, lookup solid, copy dashed, chance dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distances = [row["distance"] for row in d["rows"]]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, colour in (("tinytx", "tab:blue"), ("lstm", "tab:orange")):
        for kind, style in (("lookup", "o-"), ("copy", "s--")):
            ax.plot(distances, [row[f"{name}_{kind}"] for row in d["rows"]], style, color=colour,
                    label=f"{LABELS[name]} {kind}")  # fmt: skip
    ax.axhline(d["chance"], color="k", linestyle=":", label=f"chance (1 of {d['task']['num_pairs']} values)")
    ax.set_xscale("log")
    ax.minorticks_off()  # the log axis's own minor labels would overprint the distances
    ax.set_xticks(distances, labels=[str(x) for x in distances])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("tokens between the key (or list) and the question (or repeat)")
    ax.set_ylabel("answers right")
    ax.set_title(f"Lookups by distance: same parameters, same budget ({d['budget']} each)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def render_lookup_map(weights: torch.Tensor, labels: torch.Tensor, distance: int, title: str):
    """One head's attention at the questions of one lookup probe: a row per question (the key asked), a column per
    earlier position, a ring on the value that follows the matching key `distance` tokens back."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    answers = torch.nonzero(labels != -100).flatten()  # position of each value asked for
    questions = answers - 1
    rows = weights[questions, : int(questions.max()) + 1]
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.35 * len(questions)))
    image = ax.imshow(rows.numpy(), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    targets = questions - distance + 1  # the value right after the key
    ax.scatter(targets.numpy(), range(len(questions)), s=90, facecolors="none", edgecolors="red", label="its value")
    ax.set_yticks(range(len(questions)), labels=[f"question at {q}" for q in questions.tolist()], fontsize=8)
    ax.set_xlabel("position looked at (the key-value pairs open the sequence)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="attention weight")
    fig.tight_layout()
    return fig


def cores_gain(single: dict, name: str) -> float:
    """What all cores add to one model's tokens/s at the longest length (one sequence per step)."""
    longest = [row for row in single["rows"] if row["length"] == single["rows"][-1]["length"]]
    return longest[-1][f"{name}_tokens_per_s"] / longest[0][f"{name}_tokens_per_s"]


def cores_spoiled(single: dict) -> bool:
    """Threads that wait on partners preempted by other processes make both models slower on more cores: then the
    core count says nothing about the models, and the report says so instead of naming a cross-over."""
    return single["cores"] > 1 and cores_gain(single, "tinytx") < 1 and cores_gain(single, "lstm") < 1


def claims_table(r: dict) -> list[tuple[str, str, str]]:
    """(claim, what the seeds say, what was measured here) for each claim."""
    q, s, d, c, p, h = (r[k] for k in ("quadratic", "sequential", "lookup", "coref", "positions", "heads"))
    first, last, single = s["rows"][0], s["rows"][-1], s["single_sequence"]
    it, resolved = c["heads"]["it"], c["heads"]["last"]
    by_role = {row["role"]: row for row in h["rows"]}
    prev, bos = by_role["previous_token"], by_role["first_token"]
    lookup_head = next(row for row in r["lookup_head"]["rows"] if row["role"] == "induction")
    on_value = r["lookup_head"]["weight_on_value_at_questions"]
    t, l = d["training"]["tinytx"], d["training"]["lstm"]

    def curve(name, kind):
        return " / ".join(f"{row[f'{name}_{kind}']:.2f}" for row in d["rows"])

    def speeds(threads):
        rows = [row for row in single["rows"] if row["threads"] == threads]
        return ", ".join(f"{row['length']}: {row['tinytx_tokens_per_s']:,.0f} vs {row['lstm_tokens_per_s']:,.0f}"
                         for row in (rows[0], rows[-1]))  # fmt: skip

    def crossing(threads):
        length = single["crossover"][threads]
        return f"from length {length}" if length else f"at no length up to {single['rows'][-1]['length']}"

    def gain(name):
        return cores_gain(single, name)

    cores = single["cores"]
    scaling = (f"The {cores}-core measurement was spoiled by other processes (both models slower on {cores} cores "
               f"than on 1; load average {single['load_average'][0]:.1f} to {single['load_average'][1]:.1f})"
               if cores_spoiled(single) else
               f"TinyTx reads more tokens/s {crossing(1)} on 1 core, {crossing(cores)} on {cores} cores; at the "
               f"longest, {cores} cores speed TinyTx up ×{gain('tinytx'):.2f}, "
               f"the LSTM ×{gain('lstm'):.2f}")  # fmt: skip
    return [
        ("1. Twice the window, about four times the looking work",
         "pairing every token with every token grows with n²",
         f"n → 2n: attention FLOPs ×{q['flop_growth_when_n_doubles']:.1f}, time ×{q['time_growth_when_n_doubles']['eager']:.2f} "
         f"(eager), ×{q['time_growth_when_n_doubles']['sdpa']:.2f} (sdpa), n = {q['rows'][0]['n']}…{q['rows'][-1]['n']}"),
        ("2. You cannot compute token 50's summary until token 49 is done",
         "a recurrent model's steps wait on each other; attention is a few big matrix products",
         f"one sequence per step, training tokens/s TinyTx vs LSTM by length, on 1 core: {speeds(1)}; on {cores} "
         f"cores: {speeds(cores)}. {scaling}. Batch {s['batch_size']}, {s['threads']} thread(s): at length "
         f"{first['length']} TinyTx "
         f"{first['tinytx_tokens_per_s']:,.0f} vs LSTM {first['lstm_tokens_per_s']:,.0f} tokens/s, at "
         f"{last['length']} {last['tinytx_tokens_per_s']:,.0f} vs {last['lstm_tokens_per_s']:,.0f} "
         f"({s['parameters']['tinytx']:,} vs {s['parameters']['lstm']:,} parameters)"),
        ("3. A fact from word 1 had a hard time still being alive at word 200",
         "a running summary forgets with distance; attention's path is one step at any distance",
         f"{d['task']['num_pairs']} key-value pairs, each key asked later (MQAR), after {d['budget']} of training "
         f"each; value right with the key {' / '.join(str(row['distance']) for row in d['rows'])} tokens back: "
         f"TinyTx ({t['parameters']:,} parameters, {t['steps']} steps) {curve('tinytx', 'lookup')}; LSTM "
         f"({l['parameters']:,}, {l['steps']} steps) {curve('lstm', 'lookup')} (chance {d['chance']:.2f}). A list "
         f"of 8 copied that far back: TinyTx {curve('tinytx', 'copy')}; LSTM {curve('lstm', 'copy')}"),
        ("4. The animal didn't cross the street because it was too tired",
         "attention lets \"it\" pull information from the animal rather than the street",
         f"resolving \"it\": {c['coref']:.2f} on held-out sentences, {c['coref_new_nouns']:.2f} with unseen nouns (chance 0.50); "
         f"best head at the final \"The\" ({resolved['layer']}.{resolved['head']}) puts {resolved['referent_weight']:.2f} "
         f"on the referent vs {resolved['other_weight']:.2f} on the other noun; at \"it\" itself ({it['layer']}.{it['head']}) "
         f"{it['referent_weight']:.2f} vs {it['other_weight']:.2f}"),
        ("5. Attention is permutation-invariant; rotary scores depend on separation",
         "shuffle the input and the output shuffles identically; rotated q·k depends on m − n",
         f"shuffle error without positions {p['permutation_max_error_without_rope']:.1e} (with RoPE "
         f"{p['permutation_max_error_with_rope']:.2f}); |q_m·k_n − q_(m+s)·k_(n+s)| ≤ {p['separation_max_error']:.1e} "
         f"(moving one token changes it by {p['score_change_when_one_token_moves']:.2f})"),
        ("6. Different heads specialise",
         "one head may attend consistently to the previous token",
         f"lookup model: the search ranks head {lookup_head['layer']}.{lookup_head['head']} first as induction "
         f"head ({lookup_head['score']:.2f}; untrained best {lookup_head['untrained_best']:.2f}, even spread "
         f"{lookup_head['even_spread']:.3f}); at each question it puts {on_value:.2f} of its weight on the value "
         f"after the key asked, {r['lookup_head']['distance']} tokens back; "
         f"corpus model: previous-token head {prev['layer']}.{prev['head']}: {prev['score']:.2f} (untrained best "
         f"{prev['untrained_best']:.2f}, even spread {prev['even_spread']:.2f}); first-token head "
         f"{bos['layer']}.{bos['head']}: {bos['score']:.2f} (untrained {bos['untrained_best']:.2f})"),
    ]  # fmt: skip


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(value):
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def lookup_sections(d: dict, head: dict) -> list[str]:
    """The report's claim 3 part: training, accuracy by distance, the task, the lookup head."""
    stages = {name: "; ".join(f"{kind} {length} from step {step}" for step, kind, length in t["stages"])
              for name, t in d["training"].items()}  # fmt: skip
    return [
        "## 3. Lookups by distance (same parameters, same training budget, same curriculum)",
        markdown_table(["model", "parameters", "steps", "tokens seen", "train s", "tokens/s", "final loss",
                        "curriculum (task, length)"],
                       [[name, t["parameters"], t["steps"], t["tokens"], t["seconds"], round(t["tokens_per_s"]),
                         t["final_loss"], stages[name]] for name, t in d["training"].items()]),
        markdown_table(["distance (tokens)", "TinyTx lookup", "LSTM lookup", "TinyTx copy", "LSTM copy"],
                       [[r["distance"], r["tinytx_lookup"], r["lstm_lookup"], r["tinytx_copy"], r["lstm_copy"]]
                        for r in d["rows"]]),
        f"Lookup (MQAR, after \"Zoology\", Arora et al. 2023): a sequence opens with {d['task']['num_pairs']} "
        f"key-value pairs (distinct keys of {d['task']['num_keys']}, values of {d['task']['num_values']}), filler "
        "ids follow, and keys are asked again, each answered by its value; the loss and the score count only those "
        "values. Probes ask half the pairs that fit, each exactly `distance` tokens after its key; chance is "
        f"{d['chance']:.2f} (one of the sequence's values at random). Copy: a list of 8 ids, filler, the list again "
        "`distance` tokens later; the score counts the repeat after its first id. Training mixes both tasks (copying "
        "alone first, the easier way into the circuit both need) and lengthens the sequences up to 512 as a model "
        f"gets 90% of its answers right, or anyway between 30% and 70% of its budget. {d['probes_per_distance']} "
        "probe sequences per distance and task, the same for both models.",
        "![lookups by distance](lookup_by_distance.png)",
        "Which head does it: the head search (`hf_tinytx.interpret.find_heads`, all roles) on lookup probes "
        f"{head['distance']} tokens apart, against the same model untrained:",
        markdown_table(["role", "layer.head", "score", "untrained model's best", "even spread"],
                       [[r["role"], f"{r['layer']}.{r['head']}", r["score"], r["untrained_best"], r["even_spread"]]
                        for r in head["rows"]]),
        "![the lookup head](lookup_head.png)",
    ]  # fmt: skip


def write_report(results: dict, out_dir: Path) -> str:
    table = markdown_table(["Claim", "What the seeds say", "Measured here"], [list(r) for r in claims_table(results)])
    q, s, h = results["quadratic"], results["sequential"], results["heads"]
    single = s["single_sequence"]
    load = results["load"]
    sections = [
        "# The seeds' claims, measured",
        f"{results['mode']} run, torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s) "
        f"({available_cores()} cores), {results['seconds']:.0f} s in all; load average (1 min) "
        f"{load['start']:.1f} at the start, {load['end']:.1f} at the end. Model for claims 4 and 6: "
        f"{results['model_source']}.",
        table,
        "## 1. Attention time vs window n (one layer, forward)",
        markdown_table(["n", "eager ms", "sdpa ms", "attention GFLOP"],
                       [[r["n"], r["eager_ms"], r["sdpa_ms"], r["attention_gflop"]] for r in q["rows"]]),
        "## 2. Training step vs sequence length (batch %d)" % s["batch_size"],
        markdown_table(["length", "TinyTx ms", "LSTM ms", "TinyTx tokens/s", "LSTM tokens/s"],
                       [[r["length"], r["tinytx_step_ms"], r["lstm_step_ms"], round(r["tinytx_tokens_per_s"]),
                         round(r["lstm_tokens_per_s"])] for r in s["rows"]]),
        "![step time](step_time.png)",
        "One sequence per step (its positions are the only parallel work), by length and core count:",
        markdown_table(["threads", "length", "TinyTx tokens/s", "LSTM tokens/s", "TinyTx ÷ LSTM"],
                       [[r["threads"], r["length"], round(r["tinytx_tokens_per_s"]), round(r["lstm_tokens_per_s"]),
                         r["tinytx_tokens_per_s"] / r["lstm_tokens_per_s"]] for r in single["rows"]]),
        "Cross-over (TinyTx ahead at this and every longer length measured): "
        + ", ".join(f"{threads} thread(s): {length or 'none'}" for threads, length in single["crossover"].items())
        + ". Load average (1 min) %.1f before these rows, %.1f after." % tuple(single["load_average"])
        + (" Both models ran slower on more cores than on one: other processes spoiled those rows, and their "
           "cross-over means nothing." if cores_spoiled(single) else ""),
        *lookup_sections(results["lookup"], results["lookup_head"]),
        "## 4. The head that resolves \"it\"",
        "At the token \"it\" a causal model has not yet read the adjective that decides the referent, so the "
        "resolution is read where the noun must be predicted (the final \"The\").",
        "![coref head](coref_head_last.png) ![it head](coref_head_it.png)",
        "## 6. Head roles of the corpus model (best head per role)",
        markdown_table(["role", "layer.head", "score", "untrained model's best", "even spread"],
                       [[r["role"], f"{r['layer']}.{r['head']}", r["score"], r["untrained_best"], r["even_spread"]]
                        for r in h["rows"]]),
    ]  # fmt: skip
    text = "\n\n".join(sections) + "\n"
    (out_dir / "REPORT.md").write_text(text)
    return table


def budget_from(parser, seconds: float | None, steps: int | None, default_seconds: float, flag: str) -> Budget:
    """--X_steps wins over --X_seconds, which wins over the mode's default seconds."""
    if steps is not None:
        if steps < 1:
            parser.error(f"--{flag}_steps must be at least 1, got {steps}.")
        return Budget(steps=steps)
    if seconds is not None and seconds <= 0:
        parser.error(f"--{flag}_seconds must be positive, got {seconds}.")
    return Budget(seconds=seconds if seconds is not None else default_seconds)


def parse_arguments(argv) -> tuple[argparse.Namespace, dict, Budget, Budget]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "results" / "seed_claims"), help="folder for the report")
    parser.add_argument("--quick", action="store_true", help="toy scale, end to end in under two minutes")
    parser.add_argument("--model", help="a trained TinyTx folder for claims 4 and 6 (default: the one trained here)")
    parser.add_argument("--lookup_seconds", type=float, help="claim 3: training time per model (full run: 200)")
    parser.add_argument("--lookup_steps", type=int, help="claim 3: training steps per model instead of seconds")
    parser.add_argument("--train_seconds", type=float, help="claims 4 and 6: corpus training time (full run: 150)")
    parser.add_argument("--train_steps", type=int, help="claims 4 and 6: corpus training steps instead of seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1,
        help="CPU threads for torch (default 1: on a shared machine, threads that wait on each other's preempted "
        "partners make small kernels many times slower, and the comparison noisy; claim 2 also measures on all "
        "cores, whatever this says)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}.")
    settings = SETTINGS["quick" if args.quick else "full"]
    lookup = budget_from(parser, args.lookup_seconds, args.lookup_steps, settings["lookup_seconds"], "lookup")
    corpus = budget_from(parser, args.train_seconds, args.train_steps, settings["train_seconds"], "train")
    return args, settings, lookup, corpus


def corpus_model(args, settings: dict, budget: Budget, log) -> tuple:
    """The model for claims 4 and 6: --model, or a TinyTx trained here on the corpus. Returns the model, its
    tokenizer, the same model untrained, held-out texts and where the model came from."""
    log("building the tokenizer and the corpus")
    tokenizer, blocks, validation = build_data(settings, args.seed)
    if args.model:
        from hf_tinytx.interpret.__main__ import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(args.model)
        untrained = TinyTxForCausalLM._from_config(model.config, attn_implementation="eager").eval()
        return model, tokenizer, untrained, validation, args.model
    log(f"training TinyTx on the corpus for {budget.describe()} (claims 4 and 6)")
    model = build_tinytx(settings, tokenizer, args.seed)
    feed = CorpusFeed(blocks, settings["batch_size"], args.seed)
    training = train_in_turns({"tinytx": model}, {"tinytx": feed}, budget, settings["lr"])["tinytx"]
    source = f"a TinyTx trained here on the corpus ({budget.describe()}, {training['steps']} steps)"
    return model, tokenizer, build_tinytx(settings, tokenizer, args.seed + 1).eval(), validation, source


def draw_figures(results: dict, out_dir: Path) -> None:
    s, d = results["sequential"], results["lookup"]
    plot_lines([r["length"] for r in s["rows"]], {name: [r[f"{name}_step_ms"] for r in s["rows"]] for name in LABELS},
               "sequence length", "training step (ms, median)", "Step time vs length, same parameters",
               out_dir / "step_time.png", logx=True)  # fmt: skip
    plot_lookup_curves(d, out_dir / "lookup_by_distance.png")


def main(argv=None) -> None:
    args, settings, lookup_budget, corpus_budget = parse_arguments(argv)
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    def log(message):
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    results = {"mode": "quick" if args.quick else "full", "load": {"start": os.getloadavg()[0]}}
    log("claim 1: attention time at n and 2n")
    results["quadratic"] = claim_quadratic(settings)
    model, tokenizer, untrained, validation, results["model_source"] = corpus_model(args, settings, corpus_budget, log)
    log("claim 2: training step time vs sequence length, and one sequence per step by length and cores")
    results["sequential"] = claim_sequential(settings, tokenizer, args.seed)
    log(f"claim 3: training TinyTx and the LSTM on lookups for {lookup_budget.describe()} each")
    results["lookup"], lookup_models, task = claim_lookup(settings, lookup_budget, args.seed)
    log("claim 4: resolving 'it'")
    results["coref"] = claim_coref(settings, model, tokenizer, out_dir)
    log("claim 5: permutation and separation checks")
    results["positions"] = claim_positions()
    log("claim 6: head roles, and the lookup head")
    results["heads"] = claim_heads(settings, model, untrained, tokenizer, validation[: settings["head_texts"]])
    results["lookup_head"] = claim_lookup_head(settings, lookup_models["tinytx"], task, args.seed, out_dir)
    draw_figures(results, out_dir)
    results["seconds"] = time.perf_counter() - started
    results["load"]["end"] = os.getloadavg()[0]
    table = write_report(results, out_dir)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    log(f"report written to {out_dir / 'REPORT.md'}")
    print(table)
    print(json.dumps({"benchmark": "seed_claims", **results}, default=str))


if __name__ == "__main__":
    main()
