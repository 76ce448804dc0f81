"""Which runs plan themselves: a run on the user's data with no size flag. Kept apart from choose.py so that
the flags' checks (pretrain_args.py, before torch loads) read it without the planner."""

from hf_tinytx_training.errors import UserInputError


# Any of these means the user sized the model: no plan.
SIZE_FLAGS = frozenset({"model_preset", "model_config", "init_from", "hidden_size", "intermediate_size",
                        "num_hidden_layers", "num_attention_heads", "num_key_value_heads"})


def wanted(data_args, explicit: frozenset) -> bool:
    """A run on the user's data with no size of the user's."""
    return bool(data_args.train_file or data_args.dataset_name) and not (SIZE_FLAGS & explicit)


def refuse_plan_only_without_a_plan(data_args, train_args, explicit: frozenset) -> None:
    """--plan_only on a run that makes no plan would train instead of printing one."""
    if train_args.plan_only and not wanted(data_args, explicit):
        raise UserInputError(
            "--plan_only prints the plan of a run on your own data, and this run makes none; give "
            "--train_file or --dataset_name and leave out the size flags (--model_preset, --hidden_size, "
            "...)."
        )
