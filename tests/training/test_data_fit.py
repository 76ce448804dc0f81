"""training/data/fit.py: the sizes a run picks for a small text, what it says, and what it refuses."""

from hf_tinytx_training.data.fit import (
    MIN_BLOCK,
    Asked,
    Text,
    fit,
    memorising_warning,
    passes,
)


DEFAULTS = dict(block_size=128, per_device_train_batch_size=16, gradient_accumulation_steps=1, num_processes=1)


def asked(**changes) -> Asked:
    explicit = frozenset(changes.pop("explicit", ()))
    return Asked(**{**DEFAULTS, **changes}, explicit=explicit)


def test_a_corpus_keeps_the_sizes_asked_and_says_nothing():
    plan = fit(Text(train_chunks=(300_000, 120_000), validation_tokens=20_000, held_out=True), asked(), share=0.05)
    assert (plan.block_size, plan.per_device_train_batch_size, plan.validation_from_end) == (128, 16, 0)
    assert plan.notes == [] and plan.problem is None


def test_a_page_gets_a_shorter_block_and_a_smaller_batch_each_said_in_a_line():
    # 12 paragraphs: 1,000 training tokens, one held-out paragraph of 89 (the case)
    plan = fit(Text(train_chunks=(1000,), validation_tokens=89, held_out=True), asked(), share=0.05)
    assert (plan.block_size, plan.per_device_train_batch_size, plan.validation_from_end) == (64, 8, 0)
    assert 1000 // 64 >= 8  # one optimizer step fits
    assert len(plan.notes) == 2
    assert plan.notes[0].startswith("--block_size 64 instead of 128: the validation text holds 89 tokens")
    assert plan.notes[1].startswith("--per_device_train_batch_size 8 instead of 16: the text makes 15 training "
                                    "block(s)")


def test_one_paragraph_validates_on_the_end_of_its_own_text():
    plan = fit(Text(train_chunks=(100,), validation_tokens=0, held_out=True), asked(), share=0.05)
    assert plan.problem is None
    # The largest block that leaves a validation block and one step: 32 (68 tokens left: 2 blocks, a batch of 2)
    assert plan.validation_from_end == plan.block_size == 2 * MIN_BLOCK
    assert plan.per_device_train_batch_size == 2
    assert plan.notes[0].startswith("Validation: the last 32 of the text's 100 tokens")


def test_sizes_given_on_the_command_line_are_kept_or_refused_with_the_flags_that_fit():
    text = Text(train_chunks=(1000,), validation_tokens=89, held_out=True)
    plan = fit(text, asked(explicit={"block_size"}), share=0.05)  # 128 kept: validation from the end instead
    assert plan.block_size == 128 and plan.validation_from_end == 128 and plan.problem is None

    plan = fit(text, asked(explicit={"block_size", "per_device_train_batch_size", "validation_split_percentage"}),
               share=0.05)
    assert plan.problem == (
        "Too little text for these sizes: the validation text holds 89 tokens, less than one block of 128; the "
        "training text makes 7 blocks of 128 tokens, fewer than one optimizer step takes (16); run with --block_size "
        "64 --per_device_train_batch_size 8 (or leave the sizes out: they are then fitted to the text).")


def test_a_given_total_batch_size_is_named_again_in_the_fix():
    text = Text(train_chunks=(1000,), validation_tokens=500, held_out=False)
    plan = fit(text, asked(per_device_train_batch_size=4, gradient_accumulation_steps=4,
                           explicit={"total_batch_size", "block_size"}), share=0.05)
    assert plan.problem.endswith("run with --block_size 128 --per_device_train_batch_size 1 --total_batch_size 4 "
                                 "(or leave the sizes out: they are then fitted to the text).")


def test_too_little_text_for_any_size_says_how_much_is_needed():
    plan = fit(Text(train_chunks=(20,), validation_tokens=0, held_out=True), asked(num_processes=2), share=0.05)
    assert plan.problem.endswith("give more text: at least 48 tokens for 2 process(es) (one block of 16 each, and "
                                 "one to validate on).")


def test_a_run_that_reads_its_blocks_too_often_is_warned_with_a_step_count_that_does_not():
    assert passes(600, 8, 15) == 320
    warning = memorising_warning(600, 8, 15)
    assert warning.startswith("Warning: 600 steps of 8 blocks read the 15 training blocks 320 times")
    assert memorising_warning(10, 8, 8) is None  # ten passes: not yet
    steps = int(warning.split("--max_train_steps ")[1].split()[0])
    assert memorising_warning(steps, 8, 15) is None
    assert memorising_warning(3000, 16, 28_940) is None  # the built-in corpus's default run


def test_the_advised_steps_end_their_warm_up_first():
    # A paragraph: one block a step. Five passes are 5 steps, which a 30-step warm-up would never get through.
    warning = memorising_warning(600, 1, 1, warmup_steps=30)
    assert warning.endswith("set --max_train_steps 5 --num_warmup_steps 0 (about 5 passes).")
    assert "--num_warmup_steps" not in memorising_warning(600, 8, 150, warmup_steps=30)  # 93 steps: past it


def test_samples_start_where_the_validation_documents_do():
    from hf_tinytx_training.data.packing import document_starts

    eos = 0
    blocks = [[5, 6, 7, 0, 8, 9], [10, 0, 11, 0, 12, 13], [14, 15, 0, 16, 17, 18]]
    # block 1 starts mid-document (10 is not a start); 11 alone is too short; 16 17 18 runs to the block's end
    assert document_starts(blocks, eos, count=5, length=3) == [[5, 6, 7], [8, 9], [12, 13], [16, 17, 18]]
    assert document_starts(blocks, eos, count=2, length=8) == [[5, 6, 7], [8, 9]]
    assert document_starts(blocks, eos, count=0) == []


def test_the_sizes_a_command_sets_are_read_from_its_flags_and_its_file(tmp_path):
    from hf_tinytx_training.args import explicit_flags

    (tmp_path / "run.yaml").write_text("block_size: 64\nmax_train_steps: 10\n")
    assert explicit_flags(["--per_device_train_batch_size", "4", "--seed=3"]) == {"per_device_train_batch_size",
                                                                                 "seed"}
    assert explicit_flags([str(tmp_path / "run.yaml"), "--seed", "1"]) == {"block_size", "max_train_steps", "seed"}
