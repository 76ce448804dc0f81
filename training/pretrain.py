"""Pre-train a TinyTx model from scratch, then export a complete, shareable Hugging Face model folder.

    python training/pretrain.py                                   # 0.17M params on the embedded corpus, CPU,
                                                                  # minutes
    python training/pretrain.py training/configs/tiny.yaml        # the same arguments, from a file
    accelerate launch --config_file training/configs/accelerate-ddp.yaml training/pretrain.py --model_preset
                                                                  small
    torchrun --nproc_per_node 2 training/pretrain.py              # CPU data parallelism

The flags, the output folder, the model's config file and the data files are checked first, in about a
second; then torch loads (~7 s) and pretrain_run.py trains: `setup` -> `fit` -> `finish` ->
`export_and_push`. SIGTERM or SIGINT stops the run at the next step boundary with a checkpoint;
`--resume_from_checkpoint latest` continues it.
"""

from hf_tinytx_training.cli import run_script


def main(argv: list[str] | None = None) -> None:
    """The input checked, then the run. Both imports wait for the stop signals' handlers (`run_script`)."""
    from hf_tinytx_training.pretrain_args import preflight

    preflight(argv)
    from hf_tinytx_training.pretrain_run import pretrain  # torch, Accelerate, the data and model modules

    pretrain(argv)


if __name__ == "__main__":
    run_script("pretrain", main)
