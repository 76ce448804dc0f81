"""The seeds' claims, demonstrated and measured: attention you can see, and why it
beat reading one token at a time.

The two explainer texts the project started from make six checkable claims. This script measures each
one on this machine and writes a report: a table of claims (what the seeds say, what was measured
here), the detail tables and the figures.

    python -m benchmarks.seed_claims                    # ~60 minutes on a quiet 2-core CPU (3 seeds for claim
                                                        # 4)
    python -m benchmarks.seed_claims --quick            # everything at toy scale, into
                                                        # benchmarks/results/quick/
    python -m benchmarks.seed_claims --model out/tinytx # claims 4 and 6 on a model trained by
                                                        # training/pretrain.py
    python -m benchmarks.seed_claims --seed 21 --lookup_steps 1500   # one seed for claim 4; claim 3 in steps
                                                                     # too

1. Twice the window, about four times the looking work: one attention layer
   timed at n and 2n (attention_scaling).
2. Token 50 waits for token 49: training tokens/s of TinyTx and of an LSTM with about as many parameters, how
   each one's step time grows with sequence length, and, one sequence per step, where TinyTx overtakes the
   LSTM as the sequence grows and cores are added.
3. A fact from word 1 hardly survives to word 200: TinyTx and an LSTM of as many parameters trained for the
   same time on a lookup task of the MQAR kind ("Zoology", Arora et al., 2023: key-value pairs first,
   questions for the keys later) and on copying, then asked at exact distances from 12 to 400 tokens.
4. "...because it was too tired": TinyTx's accuracy at resolving "it", and the map of its best "it" head.
5. Attention alone ignores order; rotary positions make scores depend on separation only (numerical checks).
6. Different heads specialise: the best heads per role in the trained models (the lookup head of claim 3's
   model among them, with its map), against the same models untrained.

Writes REPORT.md, results.json and PNGs to --out (default benchmarks/results/seed_claims/; with --quick
benchmarks/results/quick/seed_claims/, a scratch folder git ignores, so a toy run never replaces the committed
report). Prints the claims table, then, last, one JSON line with the figures. The lookup task lives in
lookup_task.py, the LSTM in lstm_baseline.py, the report and figures in report.py, all three beside this file.
"""

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path


BENCHMARKS = Path(__file__).resolve().parents[1]

# Everything that differs between --quick and the full run.
SETTINGS = {
    "full": dict(
        scaling_lengths=(512, 1024, 2048),
        scaling_hidden=256,
        scaling_heads=4,
        scaling_repeats=5,
        step_lengths=(64, 128, 256, 512),
        step_batch=8,
        step_repeats=5,
        single_lengths=(64, 128, 256, 512, 1024),
        # Claims 4 and 6, on RULE_MIX's corpus: ~0.17M parameters (input and output embeddings shared), 2
        # layers (the fewest that can chain "read the role from the adjective" and "copy the noun in that
        # role"). Blocks of 128 (a coreference document is ~60 tokens). The rule arrives late and suddenly
        # (rule_ablation.py), at a step that small changes move: width 64 at lr 5e-3 on 60,000 documents
        # learnt it at ~1,000 steps on seeds 0 and 2, and on seed 1 at ~1,000 with a 6,000-step schedule but
        # ~3,300 with a 3,500-step one. 6,000 steps leave room for a late start and for copying the pieces of
        # a noun never seen after it; 60,000 documents (~35,000 blocks) are read under 3 times. 200 probes per
        # kind: at 50, one probe moves an accuracy by 0.02.
        model=dict(
            hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
            tie_word_embeddings=True,
        ),
        vocab_size=1024,
        num_documents=60000,
        block_size=128,
        batch_size=16,
        train_steps=6000,
        lr=5e-3,
        warmup=50,
        probes_per_kind=200,
        head_texts=16,
        seeds=(0, 1, 2),
        # Claim 3, the lookup task: 16 pairs as in Zoology's smaller settings; width 64 (~150k
        # parameters) is where Zoology's two-layer attention already solves MQAR, and it keeps a
        # step at 512 tokens under a second.
        lookup_task=dict(num_pairs=16, num_keys=64, num_values=64, num_fillers=16),
        lookup_model=dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4),
        lookup_stages=(
            ("copy", 80), ("copy+lookup", 80), ("copy+lookup", 160), ("copy+lookup", 320),
            ("copy+lookup", 512),
        ),
        # lr 1e-2 with 100 warm-up steps: at 3e-3 TinyTx had started neither copying nor lookups after 800
        # steps; the LSTM learnt neither at 1e-2, 3e-3 or 1e-3 in 500 steps (tried).
        lookup_batch=32,
        lookup_lr=1e-2,
        lookup_warmup=100,
        lookup_seconds=200.0,
        lookup_distances=(12, 25, 50, 100, 200, 400),
        lookup_probes=64,
        map_distance=200,
    ),
    "quick": dict(
        scaling_lengths=(128, 256), scaling_hidden=64, scaling_heads=2, scaling_repeats=3,
        step_lengths=(32, 64), step_batch=4, step_repeats=3, single_lengths=(32, 64),
        model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        vocab_size=320, num_documents=300, block_size=128, batch_size=4, train_steps=40, lr=3e-3, warmup=10,
        probes_per_kind=4, head_texts=3, seeds=(0, 1),
        lookup_task=dict(num_pairs=8, num_keys=32, num_values=32, num_fillers=8),
        lookup_model=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        lookup_stages=(("copy", 48), ("copy+lookup", 48), ("copy+lookup", 96)), lookup_batch=8,
        lookup_lr=1e-2, lookup_warmup=10, lookup_seconds=6.0, lookup_distances=(12, 25, 50, 100, 200, 400),
        lookup_probes=4, map_distance=200,
    ),
}


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


def budget_from(parser, seconds: float | None, steps: int | None, default: Budget, flag: str) -> Budget:
    """--X_steps wins over --X_seconds, which wins over the mode's default."""
    if steps is not None:
        if steps < 1:
            parser.error(f"--{flag}_steps must be at least 1, got {steps}.")
        return Budget(steps=steps)
    if seconds is not None and seconds <= 0:
        parser.error(f"--{flag}_seconds must be positive, got {seconds}.")
    return Budget(seconds=seconds) if seconds is not None else default


def parse_arguments(argv) -> tuple[argparse.Namespace, dict, Budget, Budget]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seed_claims", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out",
        help="folder for the report (default benchmarks/results/seed_claims, or with --quick the scratch "
        "folder benchmarks/results/quick/seed_claims)",
    )
    parser.add_argument("--quick", action="store_true", help="toy scale, end to end in a few minutes")
    parser.add_argument(
        "--model", help="a trained TinyTx folder for claims 4 and 6 (default: the one trained here)"
    )
    parser.add_argument(
        "--lookup_seconds", type=float, help="claim 3: training time per model (full run: 200)"
    )
    parser.add_argument(
        "--lookup_steps", type=int, help="claim 3: training steps per model instead of seconds"
    )
    parser.add_argument("--train_steps", type=int, help="claims 4 and 6: corpus training steps (full run: %d)"
                        % SETTINGS["full"]["train_steps"])
    parser.add_argument(
        "--train_seconds", type=float, help="claims 4 and 6: corpus training time instead of steps"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="claim 4: a corpus model trained and scored per seed (default: 0 1 2; --quick: 0 1). The "
        "first seed's model is claim 6's too, and the first seed seeds every other claim (with --model, "
        "that model alone)",
    )
    parser.add_argument("--seed", type=int, help="one seed: the same as --seeds SEED")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: on a shared machine, threads that wait on each other's "
        "preempted partners make small kernels many times slower, and the comparison noisy; claim 2 also "
        "measures on all cores, whatever this says)",
    )
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}.")
    if args.seed is not None and args.seeds:
        parser.error("give --seeds or --seed, not both.")
    settings = SETTINGS["quick" if args.quick else "full"]
    args.seeds = args.seeds or ([args.seed] if args.seed is not None else list(settings["seeds"]))
    if len(set(args.seeds)) < len(args.seeds):
        parser.error(f"--seeds repeats a seed ({' '.join(map(str, args.seeds))}); give each once.")
    args.seed = args.seeds[0]
    args.out = args.out or str(BENCHMARKS / "results" / ("quick" if args.quick else "") / "seed_claims")
    lookup = budget_from(
        parser, args.lookup_seconds, args.lookup_steps, Budget(seconds=settings["lookup_seconds"]), "lookup"
    )
    corpus = budget_from(
        parser, args.train_seconds, args.train_steps, Budget(steps=settings["train_steps"]), "train"
    )
    return args, settings, lookup, corpus


if __name__ == "__main__":  # --help, a mistyped flag or a bad budget are answered before torch loads (~7 s)
    parse_arguments(None)

import torch  # noqa: E402

# scripts in benchmarks/: see __init__
from benchmarks.attention_scaling import attention_flops, time_interleaved  # noqa: E402
from benchmarks.common import count_parameters, interleaved_medians  # noqa: E402
from hf_tinytx import TinyTxConfig, TinyTxForCausalLM  # noqa: E402
from hf_tinytx.corpus import RULE_MIX, Mix, default_corpus, make_probes  # noqa: E402
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

from .lookup_task import LookupFeed, LookupTask, copy_probes, lookup_probes  # noqa: E402
from .lstm_baseline import lstm_matching  # noqa: E402
from .report import draw_figures, render_lookup_map, save_figure, write_report  # noqa: E402


EXAMPLE_SENTENCE = "The animal didn't cross the street because it was too tired. The"


# ------------------------------------------------------------------------------------------------------------
# Data and models
# ------------------------------------------------------------------------------------------------------------


def build_data(settings: dict, seed: int, mix: Mix = RULE_MIX):
    """A BPE trained on the corpus, and the training split cut into (blocks, block_size)
    token ids. The corpus is RULE_MIX's (three statements in four name two made-up nouns,
    which only the rule resolves), or `mix`'s."""
    from hf_tinytx.tokenization import train_bpe_tokenizer

    corpus = default_corpus(num_documents=settings["num_documents"], seed=seed, mix=mix)
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
    )
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
    """Trains every model for the same budget, taking steps in turn (so a busy neighbour slows
    all of them alike), each on batches from its own feed. Returns per-model steps, tokens,
    seconds, tokens/s and final loss."""
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
    }


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


# ------------------------------------------------------------------------------------------------------------
# The claims
# ------------------------------------------------------------------------------------------------------------


def claim_quadratic(settings: dict) -> dict:
    lengths = settings["scaling_lengths"]
    hidden, heads, repeats = (
        settings["scaling_hidden"], settings["scaling_heads"], settings["scaling_repeats"],
    )
    times = time_interleaved(lengths, hidden, heads, repeats)
    rows = []
    for n in lengths:
        rows.append({
            "n": n, "eager_ms": times["eager"][n] * 1e3, "sdpa_ms": times["sdpa"][n] * 1e3,
            "attention_gflop": attention_flops(n, settings["scaling_hidden"]) / 1e9,
        })
    growth = {
        backend: statistics.median(
            times[backend][2 * n] / times[backend][n] for n in lengths if 2 * n in lengths
        )
        for backend in ("eager", "sdpa")
    }
    flop_growth = attention_flops(2 * lengths[0], 1) / attention_flops(lengths[0], 1)
    return {"rows": rows, "time_growth_when_n_doubles": growth, "flop_growth_when_n_doubles": flop_growth}


def claim_sequential(settings: dict, tokenizer, seed: int) -> dict:
    """Step time (forward + backward + update) of both models at each sequence length,
    interleaved; then, with one sequence per step (nothing to spread over cores but its
    positions), tokens/s by length on one core and on all."""
    models = build_pair(settings, tokenizer, seed)
    optimizers = {name: make_optimizer(model, settings["lr"]) for name, model in models.items()}

    def step_medians(batch_size: int, length: int) -> dict[str, float]:
        batch = torch.randint(
            0, len(tokenizer), (batch_size, length), generator=torch.Generator().manual_seed(seed)
        )
        runs = {name: (lambda m=model, o=optimizers[name]: training_step(m, o, batch, batch))
                for name, model in models.items()}
        return interleaved_medians(runs, repeats=settings["step_repeats"], warmup=1)

    batch_size = settings["step_batch"]
    rows = []
    for length in settings["step_lengths"]:
        medians = step_medians(batch_size, length)
        rows.append({"length": length, **{f"{name}_step_ms": t * 1e3 for name, t in medians.items()},
                     **{f"{name}_tokens_per_s": batch_size * length / t for name, t in medians.items()}})
    growth = {}
    for name in models:
        ratios = [b[f"{name}_step_ms"] / a[f"{name}_step_ms"] for a, b in zip(rows, rows[1:])
                  if b["length"] == 2 * a["length"]]
        growth[name] = statistics.median(ratios) if ratios else float("nan")

    # The seeds' point is about parallel hardware: attention's positions are independent work, the LSTM's are
    # a chain. One sequence per step leaves the positions as the only parallel work, so tokens/s by length and
    # by core count shows where, if anywhere, TinyTx overtakes the LSTM.
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
    }


def crossover_lengths(single: list[dict]) -> dict[int, int | None]:
    """Per thread count, the shortest measured length from which on TinyTx reads at least as many tokens/s as
    the LSTM at every longer measured length (None: the LSTM is ahead at the longest)."""
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
    config = TinyTxConfig(
        vocab_size=task.vocab_size, max_position_embeddings=1024, bos_token_id=0, eos_token_id=0,
        pad_token_id=0, **settings["lookup_model"],
    )
    torch.manual_seed(seed)
    tinytx = TinyTxForCausalLM._from_config(config, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return {"tinytx": tinytx, "lstm": lstm_matching(count_parameters(tinytx), task.vocab_size)}


def claim_lookup(settings: dict, budget: Budget, seed: int) -> tuple[dict, dict, LookupTask]:
    """Both models trained for the same budget on the same curriculum, then asked at each exact distance (the
    same probes for both). Returns the results, the trained models and the task."""
    task = LookupTask(**settings["lookup_task"])
    models = build_lookup_pair(settings, task, seed)
    feeds = {
        name: LookupFeed(task, settings["lookup_stages"], settings["lookup_batch"], seed) for name in models
    }
    training = train_in_turns(models, feeds, budget, settings["lookup_lr"], settings["lookup_warmup"])
    for name, feed in feeds.items():
        training[name]["stages"] = [(step, *settings["lookup_stages"][i]) for step, i in feed.log]
        training[name]["parameters"] = count_parameters(models[name])
    rows = []
    for distance in settings["lookup_distances"]:
        generator = torch.Generator().manual_seed(seed + distance)
        probes = {"lookup": lookup_probes(task, settings["lookup_probes"], distance, generator),
                  "copy": copy_probes(task, settings["lookup_probes"], distance, generator)}
        rows.append({"distance": distance, **{f"{name}_{kind}": probe_accuracy(model, *probes[kind])
                                              for name, model in models.items() for kind in probes}})
    results = {"rows": rows, "training": training, "budget": budget.describe(), "task": vars(task),
               "chance": 1 / task.num_pairs, "probes_per_distance": settings["lookup_probes"]}
    return results, models, task


def claim_lookup_head(settings: dict, model, task: LookupTask, seed: int, out_dir: Path) -> dict:
    """The lookup head, found by the head search among all its roles on probes at the map's distance, against
    the same model untrained; and its attention at the questions of one probe."""
    distance = settings["map_distance"]
    ids, labels = lookup_probes(task, 4, distance, torch.Generator().manual_seed(seed + 7))
    sequences = [row.tolist() for row in ids]
    untrained = build_lookup_pair(settings, task, seed + 1)["tinytx"].eval()
    found = {"trained": find_heads(model, None, sequences, top=1),
             "untrained": find_heads(untrained, None, sequences, top=1)}
    even = {
        "previous_token": uniform_baseline(len(sequences[0])),
        "first_token": uniform_baseline(len(sequences[0])),
        "induction": statistics.mean(induction_baseline(s) for s in sequences),
    }
    rows = [{"role": role, "layer": best[0].layer, "head": best[0].head, "score": best[0].score,
             "untrained_best": found["untrained"][role][0].score, "even_spread": even[role]}
            for role, best in found["trained"].items()]
    lookup = next(row for row in rows if row["role"] == "induction")
    weights = attention_weights(model, ids)[lookup["layer"], :, lookup["head"]]  # (probes, n, n)
    questions = torch.nonzero(labels[0] != -100).flatten() - 1  # the same places in every probe of one call
    on_value = weights[:, questions, questions - distance + 1].mean().item()
    title = (f"layer {lookup['layer']}, head {lookup['head']}, the lookup head found: "
             f"questions {distance} tokens after their keys")
    save_figure(render_lookup_map(weights[0], labels[0], distance, title), out_dir / "lookup_head.png")
    return {
        "rows": rows, "distance": distance, "weight_on_value_at_questions": on_value,
        "map": "lookup_head.png",
    }


def claim_coref(args, settings: dict, budget: Budget, first: "CorpusModel", out_dir: Path, log) -> dict:
    """Claim 4 on a corpus model per seed (the first seed's is `first`, already trained; with
    --model, that one alone): accuracy on held-out sentences and on unseen nouns, and the best
    heads. The first model's heads are drawn."""
    rows = [coref_row(settings, first)]
    for seed in [] if args.model else args.seeds[1:]:
        log(f"claim 4: training the corpus model of seed {seed} for {budget.describe()}")
        rows.append(coref_row(settings, train_corpus_model(settings, budget, seed)))
    maps = attention_maps(first.model, first.tokenizer, EXAMPLE_SENTENCE)
    for query, where in (("it", "at 'it'"), ("last", "at the final 'The'")):
        layer, head = rows[0]["heads"][query]["layer"], rows[0]["heads"][query]["head"]
        save_figure(render_attention_map(maps.weights[layer, head], maps.tokens,
                                         f"layer {layer}, head {head}: best referent head {where}"),
                    out_dir / f"coref_head_{query}.png")
    spread = {kind: {"mean": statistics.mean(r[kind] for r in rows), "min": min(r[kind] for r in rows),
                     "max": max(r[kind] for r in rows)} for kind in ("coref", "coref_new_nouns")}
    return {"rows": rows, **spread, "chance": 0.5, "probes_per_kind": settings["probes_per_kind"],
            "maps": {"it": "coref_head_it.png", "last": "coref_head_last.png"}}


def coref_row(settings: dict, corpus: "CorpusModel") -> dict:
    """One model's "it": accuracy on fresh sentences with training nouns and with unseen nouns; and for the
    query at "it" and at the final "The", the head the search ranks first on the seen nouns, with its weight
    on the referent and on the other noun, on seen and on unseen nouns."""
    model, tokenizer = corpus.model, corpus.tokenizer
    probes = [p for p in make_probes(settings["probes_per_kind"], recall_distances=())
              if p.kind in ("coref", "coref_new_nouns")]
    accuracy = score_probes(model, tokenizer, probes, batch_size=16)
    heads = {}
    for query in ("it", "last"):
        seen, unseen = (coref_head_scores(model, tokenizer, [p for p in probes if p.kind == kind], query)
                        for kind in ("coref", "coref_new_nouns"))
        layer, head = divmod(int(torch.argmax(seen["score"])), seen["score"].shape[1])
        heads[query] = {
            "layer": layer, "head": head, "score": float(seen["score"][layer, head]),
            "agreement": float(seen["agreement"][layer, head]),
            "referent_weight": float(seen["referent"][layer, head]),
            "other_weight": float(seen["other"][layer, head]),
            "unseen_referent_weight": float(unseen["referent"][layer, head]),
            "unseen_other_weight": float(unseen["other"][layer, head]),
        }
    return {"seed": corpus.seed, **corpus.training, "coref": accuracy["coref"],
            "coref_new_nouns": accuracy["coref_new_nouns"], "heads": heads}


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
    # Short windows of real text: the positional roles are about neighbours, and
    # short rows keep the baseline high.
    texts = [tokenizer.decode(tokenizer(text)["input_ids"][:48]) for text in texts]
    found = {"trained": find_heads(model, tokenizer, texts, probes, top=1)}
    found["untrained"] = find_heads(untrained, tokenizer, texts, probes, top=1)
    ids = [tokenizer(text)["input_ids"] for text in texts]
    uniform = statistics.mean(uniform_baseline(len(i)) for i in ids)
    repeating = [i for i in ids if len(induction_targets(i)[0])]
    even = {"previous_token": uniform, "first_token": uniform,
            "induction": statistics.mean(induction_baseline(i) for i in repeating) if repeating else 0.0}
    rows = []
    for role in found["trained"]:
        best, random_best = found["trained"][role][0], found["untrained"][role][0]
        rows.append({"role": role, "layer": best.layer, "head": best.head, "score": best.score,
                     "untrained_best": random_best.score, "even_spread": even.get(role, 0.0)})
    return {"rows": rows, "texts": len(texts)}


@dataclass
class CorpusModel:
    """A model for claims 4 and 6, with its tokenizer: trained here on the corpus
    of `seed`, or given (--model)."""

    model: torch.nn.Module
    tokenizer: object
    untrained: torch.nn.Module  # the same shape, as initialised: what the head search compares against
    validation: list[str]  # held-out corpus texts
    seed: int | None
    training: dict  # steps and seconds ({} for a given model)
    source: str


def train_corpus_model(settings: dict, budget: Budget, seed: int) -> CorpusModel:
    tokenizer, blocks, validation = build_data(settings, seed)
    model = build_tinytx(settings, tokenizer, seed)
    feed = CorpusFeed(blocks, settings["batch_size"], seed)
    training = train_in_turns({"tinytx": model}, {"tinytx": feed}, budget, settings["lr"],
                              settings["warmup"])["tinytx"]
    source = (f"a TinyTx trained here on the corpus of seed {seed} ({training['steps']} steps, "
              f"{training['seconds']:.0f} s)")
    return CorpusModel(model, tokenizer, build_tinytx(settings, tokenizer, seed + 1).eval(), validation, seed,
                       {"steps": training["steps"], "seconds": training["seconds"]}, source)


def corpus_model(args, settings: dict, budget: Budget, log) -> CorpusModel:
    """The model for claims 4 and 6: --model, or a TinyTx trained here on the corpus of the first seed."""
    if args.model:
        from hf_tinytx.interpret.__main__ import load_model_and_tokenizer

        corpus = default_corpus(num_documents=settings["num_documents"], seed=args.seed, mix=RULE_MIX)
        validation = corpus["validation"]
        model, tokenizer = load_model_and_tokenizer(args.model)
        untrained = TinyTxForCausalLM._from_config(model.config, attn_implementation="eager").eval()
        return CorpusModel(model, tokenizer, untrained, validation, None, {}, args.model)
    log(
        f"building the tokenizer and the corpus of seed {args.seed}; training TinyTx on it for "
        f"{budget.describe()} (claims 4 and 6)"
    )
    return train_corpus_model(settings, budget, args.seed)


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
    corpus = corpus_model(args, settings, corpus_budget, log)
    results["model_source"] = corpus.source
    log("claim 2: training step time vs sequence length, and one sequence per step by length and cores")
    results["sequential"] = claim_sequential(settings, corpus.tokenizer, args.seed)
    log(f"claim 3: training TinyTx and the LSTM on lookups for {lookup_budget.describe()} each")
    results["lookup"], lookup_models, task = claim_lookup(settings, lookup_budget, args.seed)
    log(f"claim 4: resolving 'it' (seeds {' '.join(map(str, args.seeds))})")
    results["coref"] = claim_coref(args, settings, corpus_budget, corpus, out_dir, log)
    log("claim 5: permutation and separation checks")
    results["positions"] = claim_positions()
    log("claim 6: head roles, and the lookup head")
    results["heads"] = claim_heads(settings, corpus.model, corpus.untrained, corpus.tokenizer,
                                   corpus.validation[: settings["head_texts"]])
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
