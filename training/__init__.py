"""The training scripts and the pieces they share, installed as `hf_tinytx_training`
(pyproject.toml maps training/). Run them as `tinytx pretrain`, `python -m
hf_tinytx_training.pretrain` or `python training/pretrain.py`. By job:

    pretrain.py          the pre-training command: its input checked before torch loads, then pretrain_run.py
    pretrain_run.py      pre-training on Accelerate: setup -> fit -> finish -> export_and_push
    finetune.py          the fine-tuning command: its input checked before torch loads, then
                         sft/finetune_run.py
    cli.py               the `tinytx` command (also __main__.py); how both scripts run and end
    errors.py            UserInputError and RunError, raised anywhere without importing the flags
    pretrain_args.py     pretrain's flags, their checks (before torch loads: `preflight`; again in `main`),
                         the plan
    checkpoints.py       resumable checkpoints: save, verify, find, load, prune (output_dir/checkpoints/)
    evaluation.py        what a model learnt: the validation loss, every block counted once; probes and
                         samples
    memorising.py        the "learns it by heart" warning, when the validation loss rises

    data/files.py        local data files found and checked before torch loads
    data/documents.py    a source's documents (bounded), in pieces that processes read side by side
    data/sources.py      what a run reads (files, a dataset, the built-in corpus), and its tokenizer's texts
    data/fingerprint.py  what decides a run's data, kept in each checkpoint: a resume must read the same
    data/tokenizer.py    the run's tokenizer: a named one, the run's saved one, the store's, or a BPE trained
                         now
    data/token_store.py  the corpus tokenized once, by every core, into shards every process reads
    data/handoff.py      what the main process prepared, received by the others without a collective
    data/streaming.py    a text tokenized as training reads it (--streaming), shuffled in a buffer
    data/progress.py     a long preparation's progress: a bar, or a line every 15 s in a log
    data/packing.py      how a batch is read from the store: shards, validation held out, blocks, loaders
    data/sizing.py       sizes fitted to a small text (block, batch, validation), and the passes they make

    model/config_file.py the model's config file (a --model_config or a preset's, configs/), read without
                         torch
    model/config.py      the TinyTxConfig built from it, checked against the launch
    model/build.py       pretrain's model built from that config (or --init_from), placed, and sharded on CPUs
    model/cpu_training.py two speed paths on a CPU: RMSNorm with its backward written out, bf16 attention in
                          fp32

    plan/flags.py        which runs plan themselves (your data, no size flag), and --plan_only's check
    plan/ladder.py       the model sizes a run on the user's data chooses between, and their recipe
    plan/law.py          the held-out loss a size reaches after so many tokens, fitted to the sweep
    plan/speed.py        tokens per second of each size on this machine, measured in a few seconds
    plan/choose.py       the plan: the size the law predicts best in the budget; its line; read back on
                         resume

    optim/schedules.py   the run's clock (--max_train_seconds) and the learning-rate shapes over it
    optim/optimizers.py  the optimizer (AdamW, or Muon with AdamW) and the learning-rate schedule

    distributed/cluster.py    a launch across processes and machines: none alone, one shared folder, waits
                              bounded (__main__.py: torchrun whose exit status tells a stop from a crash)
    distributed/sharding.py   FSDP2 on CPUs, DeepSpeed's settings, the device, the weights gathered for saving
    distributed/preemption.py SIGTERM/SIGINT become a stop at the next step boundary: a checkpoint, exit 128 +
                              signal
    distributed/cpu_memory.py training on a CPU: freed memory kept in the process, and what is said about it
    distributed/cpu_threads.py training on a CPU: the thread count from the cores free at the start, kept
                               on resume; one line when other work takes them later

    publish/output_dir.py the output folder: checked before anything is written, claimed (locked), what may go
    publish/run_log.py   metrics.jsonl, the run's record, kept across resumes
    publish/cards.py     every model card, and what each says of its run
    publish/export.py    the finished model folder: weights, code, tokenizer, card, record (and each
                         checkpoint's)
    publish/hub.py       uploads to the Hugging Face Hub in the background, and the final push
    publish/hub_checkpoint.py a resumable checkpoint on the Hub: pushed whole to last-checkpoint/, and
                              downloaded and checked for --resume_from_checkpoint hub|REPO_ID[@REVISION]

    sft/finetune_args.py finetune's flags and the checks run before torch loads
    sft/finetune_run.py  supervised fine-tuning with Trainer, optionally LoRA: setup -> fit -> save_folders ->
                         push
    sft/records.py       finetune's data files read and checked (text, prompt/response, chat)
    sft/data.py          finetune's records tokenized into rows, and their collator
    sft/model.py         finetune's base model and tokenizer, checked against each other, and its LoRA adapter
    sft/callbacks.py     finetune's Trainer callbacks: checkpoints moved in whole, a stop at a step's end
"""
