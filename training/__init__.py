"""The training scripts and the pieces they share, installed as `hf_tinytx_training` (this folder keeps the design
card's name, `training/`; pyproject.toml maps it).

Run the scripts as `tinytx pretrain`, `python -m hf_tinytx_training.pretrain` or, in a checkout,
`python training/pretrain.py` (and `finetune` alike):

    cli.py         the `tinytx` command: runs a subcommand's module as `python -m` does
    generate.py    `tinytx generate`: a prompt continued and streamed (chat.py: `tinytx chat`); the library alone
    errors.py      UserInputError and RunError, raised anywhere without importing the flags
    args.py        command-line arguments and their checks (everything is validated before anything is written)
    schedules.py   the learning-rate shapes over the clock (read by args.py and optimization.py)
    data.py        datasets in, packed token blocks out (data_files.py: local files found and checked first)
    tokenizer.py   loading a named tokenizer (training one lives in hf_tinytx.tokenization)
    checkpoints.py resumable checkpoints: save, verify, find, prune
    preemption.py  SIGTERM/SIGINT become a stop at the next step boundary: a checkpoint, a line, exit 128 + signal
    cluster.py     a launch across processes and machines: none alone, one shared folder, every wait bounded
    distributed.py sharding (FSDP2 on CPUs, DeepSpeed's settings) and the device a launch trains on
    output_dir.py  the output folder: checked before anything is written, then locked for the run
    export.py      the finished model folder: weights, code, tokenizer, card, record (and each Hub checkpoint's)
    hub.py         uploads to the Hugging Face Hub in the background
    pretrain.py    pre-training on Accelerate: setup -> fit -> evaluate -> export
    finetune.py    supervised fine-tuning with Trainer, optionally LoRA (finetune_args.py: its flags and the checks
                   run before torch loads; sft_records.py: its data files read and checked; sft_data.py: tokenized)
    working_dir.py from the folder above a clone named hf_tinytx, the installed package, not the clone's folder
"""

from .working_dir import look_past_a_clone_named_hf_tinytx


look_past_a_clone_named_hf_tinytx()  # before anything imports hf_tinytx
