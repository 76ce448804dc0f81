"""The "learns it by heart" warning, from evidence: the validation loss rising, never a count of passes.

The rule: the last RISEN evaluations in a row are each more than MARGIN above the lowest validation loss
before them. One higher evaluation can be noise; two in a row are the turn. The warning is said once, at
the evaluation where the rule first holds, with the step of the best validation loss so far: a run that
stops there (its schedule then ends there too) or reads more text does better than this one.
"""

MARGIN = 0.01  # 1% of the loss: above what the same validation blocks move between two close evaluations
RISEN = 2  # evaluations in a row above the best


def first_rise(losses: list[float]) -> int | None:
    """The index of the evaluation where the rule first holds, or None."""
    for now in range(RISEN, len(losses)):
        best = min(losses[: now - RISEN + 1])
        if all(loss > best * (1 + MARGIN) for loss in losses[now - RISEN + 1 : now + 1]):
            return now
    return None


def memorising_warning(evaluations: list[tuple[int, float]], warmup_steps: int = 0,
                       more: str = "more text") -> str | None:
    """The warning, when the newest of `evaluations` ((step, validation loss), in order) is the first where
    the rule holds; else None. `more`: how to give the run more text."""
    losses = [loss for _, loss in evaluations]
    if not evaluations or first_rise(losses) != len(evaluations) - 1:
        return None
    best = min(range(len(losses) - RISEN), key=losses.__getitem__)
    best_step, best_loss = evaluations[best]
    risen = ", ".join(f"{loss:.4f} at step {step}" for step, loss in evaluations[-RISEN:])
    flags = f"--max_train_steps {best_step}"
    if warmup_steps >= best_step // 2:  # a run still warming up has barely moved from its start
        flags += f" --num_warmup_steps {best_step // 10}"
    return (
        f"Warning: the validation loss rose ({risen}) above its best, {best_loss:.4f} at step {best_step}: "
        f"the model is learning the training text by heart. Run with {flags} to end near that best, or "
        f"give {more}."
    )
