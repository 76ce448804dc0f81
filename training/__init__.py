"""The training scripts and the pieces they share, installed as `hf_tinytx_training` (this folder keeps the design
card's name, `training/`; pyproject.toml maps it).

Run the scripts as `tinytx pretrain`, `python -m hf_tinytx_training.pretrain` or, in a checkout,
`python training/pretrain.py` (and `finetune` alike). Every module, one line each:

    pretrain.py      pre-training on Accelerate: setup -> fit -> finish -> export_and_push
    finetune.py      supervised fine-tuning with Trainer, optionally LoRA: setup -> fit -> save_folders -> push_result
    cli.py           the `tinytx` command (a subcommand's module run as `python -m` does; __main__.py: `-m` on
                     it); how both scripts start and end (signals first, bad input before torch loads, one exit
                     status); a clone named hf_tinytx in the working folder looked past
    generate.py      `tinytx generate`: a prompt continued and streamed; the library alone, no Accelerate
    chat.py          `tinytx chat`: a terminal chat over a folder's chat template
    errors.py        UserInputError and RunError, raised anywhere without importing the flags
    args.py          pretrain's flags, their checks (before torch loads: `preflight`; again in `main`), the step plan
    finetune_args.py finetune's flags and the checks run before torch loads
    finetune_model.py finetune's base model and tokenizer, checked against each other, and its LoRA adapter
    config_file.py   the model's config file (a --model_config or a preset's, configs/), read without torch
    model_config.py  the TinyTxConfig built from it, checked against the launch
    model_build.py   pretrain's model built from that config (or --init_from), placed, and sharded on CPUs
    schedules.py     the run's clock (--max_train_seconds) and the learning-rate shapes over it
    optimization.py  the optimizer (AdamW, or Muon with AdamW) and the learning-rate schedule
    data.py          datasets in, packed token blocks out, and their loaders
    data_fit.py      sizes fitted to a small text (block, batch, validation), and the memorising warning
    data_files.py    local data files found and checked before torch loads
    sft_records.py   finetune's data files read and checked (text, prompt/response, chat)
    sft_data.py      finetune's records tokenized into rows, and their collator
    tokenizer.py     the run's tokenizer: a named one, the run's saved one, or a BPE trained on the data
    evaluation.py    the validation loss (and perplexity, bits per byte), every block counted once
    checkpoints.py   resumable checkpoints: save, verify, find, load, prune (output_dir/checkpoints/)
    callbacks.py     finetune's Trainer callbacks: checkpoints moved in whole, a stop at a step's end
    preemption.py    SIGTERM/SIGINT become a stop at the next step boundary: a checkpoint, a line, exit 128 + signal
    cluster.py       a launch across processes and machines: none alone, one shared folder, every wait bounded
    distributed.py   sharding (FSDP2 on CPUs, DeepSpeed's settings), the device, the weights gathered for saving
    cpu_memory.py    training on a CPU: freed memory kept in the process, and what is said about it
    output_dir.py    the output folder: checked before anything is written, claimed (locked), what may be replaced
    run_log.py       metrics.jsonl, the run's record, kept across resumes
    probes.py        what a pre-trained model learnt beyond its loss: probe accuracies and samples
    cards.py         every model card, and what each says of its run
    export.py        the finished model folder: weights, code, tokenizer, card, record (and each Hub checkpoint's)
    hub.py           uploads to the Hugging Face Hub in the background, and the final push
"""

from .cli import look_past_a_clone_named_hf_tinytx


look_past_a_clone_named_hf_tinytx()  # before anything imports hf_tinytx
