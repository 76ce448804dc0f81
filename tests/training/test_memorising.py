"""The "learns it by heart" warning (training/memorising.py): said once, at the evaluation where the
validation loss has risen twice in a row above its best, on made-up histories of validation losses."""

from hf_tinytx_training.data import sizing
from hf_tinytx_training.memorising import first_rise, memorising_warning


def said(losses, every=200, warmup=30):
    """The warning at each evaluation of a run evaluated every `every` steps: {index: line}."""
    evaluations = [((i + 1) * every, loss) for i, loss in enumerate(losses)]
    lines = {i: memorising_warning(evaluations[: i + 1], warmup, "a larger --train_file")
             for i in range(len(losses))}
    return {i: line for i, line in lines.items() if line}


def test_a_validation_loss_that_keeps_falling_gets_no_warning():
    # Tiny Shakespeare's run: the passes count warned, the validation loss fell at every evaluation
    assert said([4.07, 3.80, 3.61, 3.50, 3.41, 3.36, 3.32]) == {}
    assert first_rise([4.07, 3.80, 3.61]) is None


def test_one_higher_evaluation_or_a_rise_within_the_margin_is_noise():
    assert said([3.0, 2.8, 2.9, 2.7, 2.6]) == {}  # one evaluation up, then down again
    assert said([3.0, 2.8, 2.81, 2.82, 2.83]) == {}  # 1% of 2.8 is 0.028: still within


def test_two_rises_in_a_row_are_warned_once_with_the_step_of_the_best_loss():
    lines = said([3.0, 2.6, 2.5, 2.7, 2.9, 3.2, 3.5])
    assert list(lines) == [4]  # at the second evaluation above the best, and never again
    assert lines[4] == (
        "Warning: the validation loss rose (2.7000 at step 800, 2.9000 at step 1000) above its best, 2.5000 "
        "at step 600: the model is learning the training text by heart. Run with --max_train_steps 600 to "
        "end near that best, or give a larger --train_file."
    )


def test_the_advised_steps_end_their_warm_up_first():
    line = said([3.0, 2.6, 2.8, 2.9], every=20, warmup=30)[3]
    assert "--max_train_steps 40 --num_warmup_steps 4 " in line  # 30 warm-up steps of 40: barely started


def test_the_warning_before_training_from_a_count_of_passes_is_gone():
    assert not hasattr(sizing, "memorising_warning") and not hasattr(sizing, "MEMORISING_PASSES")
    assert sizing.passes(600, 8, 15) == 320  # a fact the plan line states
