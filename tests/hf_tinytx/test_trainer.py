"""transformers' Trainer drives TinyTx like a built-in model: it trains, evaluates, saves
safetensors that reload to the same logits, and its gradient accumulation is exact (the loss is
averaged over tokens, not over micro-batches)."""

from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

import hf_tinytx  # noqa: F401  (registers "tinytx" with the Auto classes)


def pad_collator(tokenizer):
    """Right padding, masked out of attention and of the loss (labels -100)."""
    return DataCollatorForLanguageModeling(tokenizer, mlm=False)


def sentence_dataset(tokenizer, sentences):
    ids = [tokenizer(text)["input_ids"] + [tokenizer.eos_token_id] for text in sentences]
    return Dataset.from_dict({"input_ids": ids})


def quiet_args(output_dir, **overrides):
    # train_sampling_strategy "sequential": the same data order whatever the batch size
    return TrainingArguments(
        output_dir=str(output_dir), report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
        dataloader_pin_memory=False, train_sampling_strategy="sequential", seed=0, **overrides,
    )


def test_trainer_trains_evaluates_saves_and_reloads(tiny_model, byte_bpe_tokenizer, tmp_path: Path):
    from tests.helpers.tiny import TINY_SENTENCES

    tokenizer = byte_bpe_tokenizer()
    model = tiny_model(vocab_size=len(tokenizer)).train()
    dataset = sentence_dataset(tokenizer, TINY_SENTENCES)
    args = quiet_args(tmp_path / "run", max_steps=20, per_device_train_batch_size=3, learning_rate=1e-2,
                      logging_steps=5, lr_scheduler_type="constant")
    trainer = Trainer(model=model, args=args, train_dataset=dataset, eval_dataset=dataset,
                      data_collator=pad_collator(tokenizer), processing_class=tokenizer)
    eval_before = trainer.evaluate()["eval_loss"]
    trainer.train()
    eval_after = trainer.evaluate()["eval_loss"]
    train_losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(train_losses) == 4
    assert train_losses[-1] < 0.7 * train_losses[0], train_losses
    assert eval_after < 0.7 * eval_before, (eval_before, eval_after)

    saved = tmp_path / "saved"
    trainer.save_model(str(saved))
    assert (saved / "model.safetensors").is_file()
    assert not list(saved.glob("pytorch_model*.bin")), "weights must be saved as safetensors only"
    assert (saved / "modeling_tinytx.py").is_file()  # the code travels with the weights

    reloaded = AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").eval()
    assert type(reloaded) is type(model)
    batch = pad_collator(tokenizer)([dataset[0], dataset[1]])
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        actual = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)  # same weights, same kernels: bit-identical


def one_step(tiny_model, dataset, collator, output_dir, batch_size, accumulation):
    """One SGD step (learning rate 1: the weight change is exactly minus the
    gradient) over all four sequences.

    Weights are drawn wider than usual (std 0.2) so the per-token losses differ between sequences; at the
    default std every token costs about log(vocab_size) and any averaging would look right."""
    model = tiny_model(seed=0, initializer_range=0.2).train()
    args = quiet_args(output_dir, max_steps=1, per_device_train_batch_size=batch_size,
                      gradient_accumulation_steps=accumulation, optim="sgd", learning_rate=1.0,
                      lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    loss = next(row["loss"] for row in trainer.state.log_history if "loss" in row)
    return loss, {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def test_gradient_accumulation_matches_one_big_batch(tiny_model, byte_bpe_tokenizer, tmp_path: Path):
    # Pad id 0: no token drawn below is 0, so only padding leaves the loss.
    collator = pad_collator(byte_bpe_tokenizer())
    generator = torch.Generator().manual_seed(1)
    # Different numbers of real tokens per sequence (3, 19, 6, 14), so a mean
    # over micro-batches would be wrong.
    lengths = [3, 19, 6, 14]
    sequences = [torch.randint(3, 128, (n,), generator=generator).tolist() for n in lengths]
    dataset = Dataset.from_dict({"input_ids": sequences})

    big_loss, big_weights = one_step(
        tiny_model, dataset, collator, tmp_path / "big", batch_size=4, accumulation=1
    )
    acc_loss, acc_weights = one_step(
        tiny_model, dataset, collator, tmp_path / "acc", batch_size=2, accumulation=2
    )

    # The naive answer (mean of the two micro-batch means) differs clearly, so the
    # check below can tell them apart.
    model = tiny_model(seed=0, initializer_range=0.2)
    with torch.no_grad():
        halves = [collator([dataset[i] for i in pair]) for pair in ((0, 1), (2, 3))]
        naive = sum(model(**half).loss.item() for half in halves) / 2
    assert abs(naive - big_loss) > 1e-3

    assert abs(acc_loss - big_loss) < 1e-5, (acc_loss, big_loss)
    initial = model.state_dict()
    assert any(
        not torch.equal(big_weights[name], initial[name]) for name in initial
    ), "the step changed nothing"
    for name in big_weights:
        torch.testing.assert_close(acc_weights[name], big_weights[name], rtol=0, atol=1e-6, msg=name)
