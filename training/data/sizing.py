"""Sizes that fit the text: a few paragraphs of one's own text train as well as a corpus does.

Text too small for the default sizes gets, in this order: a shorter block (halved down to MIN_BLOCK),
its validation from the end of the training text (one paragraph cannot be split into documents), and a
smaller batch, each change said in one line. A size given on the command line is kept; what cannot fit
it is said in one message, with the flags that would. The plan depends on the text and the flags
alone, so a resumed run plans the same sizes.
"""

from dataclasses import dataclass, field, replace


MIN_BLOCK = 16  # a shorter block leaves the model too little context to learn from


@dataclass(frozen=True)
class Text:
    """Tokens of the training text per packing chunk (a chunk's tail short of a block is dropped),
    of the validation text, and whether that was held out of the training documents (so it may
    come from the end of the text instead)."""

    train_chunks: tuple[int, ...]
    validation_tokens: int
    held_out: bool


@dataclass(frozen=True)
class Asked:
    block_size: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    num_processes: int
    explicit: frozenset = frozenset()  # the flags the command line (or its file) set


@dataclass
class Plan:
    block_size: int
    per_device_train_batch_size: int
    validation_from_end: int = 0  # tokens at the end of the training text held out for validation (0: none)
    notes: list[str] = field(default_factory=list)  # one line per size changed, saying why
    problem: str | None = None  # why the sizes cannot fit, with the flags that would (the run is refused)


def blocks_of(chunks, block_size: int) -> int:
    return sum(tokens // block_size for tokens in chunks)


def from_end(text: Text, block_size: int, share: float) -> tuple[int, int]:
    """(training blocks, validation tokens) when the validation is the end of all the text: `share` of it, in
    whole blocks, at least one. Taken from the last chunk, where the documents are regrouped."""
    chunks = list(text.train_chunks)
    chunks[-1] += text.validation_tokens  # the held-out documents go back into the text
    validation = max(1, round(share * sum(chunks) / block_size)) * block_size
    if validation >= chunks[-1]:
        return 0, validation
    chunks[-1] -= validation
    return blocks_of(chunks, block_size), validation


def fit_sizes(text: Text, asked: Asked, share: float) -> Plan:
    """The largest sizes, at most those asked, under which the validation text holds one block and
    the training text one optimizer step."""
    blocks = [asked.block_size]
    if "block_size" not in asked.explicit:
        while blocks[-1] // 2 >= MIN_BLOCK:
            blocks.append(blocks[-1] // 2)
    ends = [False, True] if text.held_out and "validation_split_percentage" not in asked.explicit else [False]
    per_step = asked.num_processes * asked.gradient_accumulation_steps
    batch_fixed = {"per_device_train_batch_size", "total_batch_size"} & asked.explicit
    for end in ends:
        for block in blocks:
            if end:
                train_blocks, validation = from_end(text, block, share)
            else:
                train_blocks, validation = blocks_of(text.train_chunks, block), 0
                if text.validation_tokens < block:
                    continue
            batch = asked.per_device_train_batch_size
            if per_step * batch > train_blocks and not batch_fixed:
                batch = min(batch, largest_power_of_two(train_blocks // per_step))
            if batch and per_step * batch <= train_blocks:
                return Plan(block, batch, validation, notes=notes_for(text, asked, block, batch, validation,
                                                                      train_blocks))
    relaxed = fit_sizes(text, replace(asked, explicit=frozenset()), share) if asked.explicit else None
    return Plan(asked.block_size, asked.per_device_train_batch_size, problem=too_little(text, asked, relaxed))


def largest_power_of_two(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def notes_for(
    text: Text, asked: Asked, block: int, batch: int, validation: int, train_blocks: int
) -> list[str]:
    total = sum(text.train_chunks) + text.validation_tokens
    notes = []
    if validation:
        why = (
            f"the documents held out hold {text.validation_tokens}, fewer than one block"
            if text.validation_tokens
            else "a single document: none to hold out"
        )
        notes.append(f"Validation: the last {validation} of the text's {total:,} tokens ({why}); set "
                     f"--validation_file to choose it.")
    if block != asked.block_size:
        why = (f"the validation text holds {text.validation_tokens} tokens" if not validation
               else f"the text holds {total:,} tokens")
        notes.append(f"--block_size {block} instead of {asked.block_size}: {why}, too few for blocks of "
                     f"{asked.block_size}; set --block_size to keep it.")
    if batch != asked.per_device_train_batch_size:
        notes.append(
            f"--per_device_train_batch_size {batch} instead of {asked.per_device_train_batch_size}: the text "
            f"makes {train_blocks} training block(s) of {block} tokens, fewer than one batch of "
            f"{asked.per_device_train_batch_size} x {asked.num_processes} process(es)."
        )
    return notes


def too_little(text: Text, asked: Asked, relaxed: Plan | None) -> str:
    """Why no sizes fit, with the flags that would (those of the plan without the
    sizes given), or how much text."""
    problems = []
    if text.validation_tokens < asked.block_size:
        problems.append(f"the validation text holds {text.validation_tokens} tokens, less than one block of "
                        f"{asked.block_size}")
    train_blocks = blocks_of(text.train_chunks, asked.block_size)
    per_step = asked.per_device_train_batch_size * asked.gradient_accumulation_steps * asked.num_processes
    if train_blocks < per_step:
        problems.append(
            f"the training text makes {train_blocks} blocks of {asked.block_size} tokens, fewer than one "
            f"optimizer step takes ({per_step})"
        )
    if relaxed is not None and relaxed.problem is None:
        flags = [f"--block_size {relaxed.block_size}",
                 f"--per_device_train_batch_size {relaxed.per_device_train_batch_size}"]
        if "total_batch_size" in asked.explicit:  # it would set the accumulation from the old batch again
            step = (
                relaxed.per_device_train_batch_size * asked.gradient_accumulation_steps * asked.num_processes
            )
            flags.append(f"--total_batch_size {step}")
        fix = f"run with {' '.join(flags)} (or leave the sizes out: they are then fitted to the text)"
    else:
        need = (asked.num_processes + 1) * MIN_BLOCK
        fix = (f"give more text: at least {need} tokens for {asked.num_processes} process(es) (one block of "
               f"{MIN_BLOCK} each, and one to validate on)")
    return f"Too little text for these sizes: {'; '.join(problems)}; {fix}."


def passes(max_train_steps: int | None, global_batch: int, train_blocks: int) -> float:
    """How many times a run of this many steps reads its training blocks: a fact for the plan line. Whether
    that is too many, the validation loss says (memorising.py)."""
    return (max_train_steps or 0) * global_batch / max(train_blocks, 1)
