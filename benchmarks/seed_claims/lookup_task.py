"""The lookup task of claim 3 of benchmarks/seed_claims/: multi-query associative recall (MQAR,
after "Zoology", Arora et al., 2023) and copying, the probes that ask them at exact distances,
and the curriculum that trains on them.
"""

import statistics
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LookupTask:
    """A small synthetic vocabulary for long-range lookups: id 0 opens every sequence, then filler, key and
    value ids. No words: every labelled token is a lookup, and a filler never looks like a key."""

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


def pairs_opening(
    task: LookupTask, keys, values, length: int, generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of `length`: the opening id, k1 v1 k2 v2 ..., filler after;
    labels all -100 (nothing to learn)."""
    ids = task.fillers((keys.shape[0], length), generator)
    ids[:, 0] = 0
    ids[:, 1 : task.pairs_end : 2], ids[:, 2 : task.pairs_end : 2] = keys, values
    return ids, torch.full_like(ids, -100)


def lookup_batch(task: LookupTask, batch: int, length: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """MQAR: after the pairs, every key is asked once, in random order at random places, its value following;
    only the values asked for are labels, so every unit of loss is a lookup."""
    keys, values = task.pairs(batch, generator)
    ids, labels = pairs_opening(task, keys, values, length, generator)
    slots = (length - task.pairs_end) // 2  # a question takes two tokens: the key, then its value
    if slots < task.num_pairs:
        raise ValueError(f"{length} tokens leave no room for {task.num_pairs} questions after the pairs.")
    where = (
        task.pairs_end + 2 * torch.rand(batch, slots, generator=generator).argsort(-1)[:, : task.num_pairs]
    )
    rows = torch.arange(batch)[:, None]
    ids[rows, where], ids[rows, where + 1] = keys, values
    labels[rows, where + 1] = values
    return ids, labels


def copy_batch(task: LookupTask, batch: int, length: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Induction: a list of distinct ids, filler of random length, the list again; the repeat
    after its first id is labelled. The gap varies, so only "find the earlier copy of this
    id, read what followed" solves it."""
    count = task.num_pairs
    lists = task.items(batch, count, generator)
    ids = task.fillers((batch, length), generator)
    ids[:, 0], ids[:, 1 : 1 + count] = 0, lists
    where = (
        1
        + count
        + torch.randint(0, length - 2 * count, (batch, 1), generator=generator)
        + torch.arange(count)
    )
    rows = torch.arange(batch)[:, None]
    ids[rows, where] = lists
    labels = torch.full_like(ids, -100)
    labels[rows, where[:, 1:]] = lists[:, 1:]
    return ids, labels


def lookup_probes(
    task: LookupTask, count: int, distance: int, generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` sequences whose every question stands exactly `distance` tokens after its key: half of the
    pairs for which that lands after the pairs, asked in the order of the pairs, filler in between."""
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
    """`count` sequences with a list of `list_length` ids repeated exactly `distance` tokens later (filler
    between); the repeat after its first id is labelled."""
    if distance <= list_length:
        raise ValueError(
            f"A list of {list_length} ids cannot be repeated {distance} tokens later without overlap."
        )
    lists = task.items(count, list_length, generator)
    ids = task.fillers((count, 1 + distance + list_length), generator)
    ids[:, 0], ids[:, 1 : 1 + list_length], ids[:, 1 + distance :] = 0, lists, lists
    labels = torch.full_like(ids, -100)
    labels[:, 2 + distance :] = lists[:, 1:]
    return ids, labels


@dataclass
class Curriculum:
    """Copying first (the easier way into the same circuit: find the earlier copy, read what
    followed), then copying and lookups mixed on ever longer sequences. A model moves up a stage once
    it gets 90% of its answers right over 20 steps, and is moved up anyway as its budget runs from 30%
    to 70%: every model ends at full length."""

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
        if (
            len(self.recent) == 20
            and statistics.mean(self.recent) > 0.9
            and self.earned < len(self.stages) - 1
        ):
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
