"""What a pre-trained model learnt: the validation loss (and perplexity, bits per byte),
every block counted once on any process count; and beyond its loss, hf_tinytx's probes
scored beside chance, and greedy samples."""

import math
from dataclasses import dataclass, field

import torch

from hf_tinytx.corpus import make_probes
from hf_tinytx.probes import chance_levels, score_probes
from hf_tinytx_training.data.packing import document_starts


@torch.no_grad()
def validation_metrics(model, eval_dataloader, accelerator, bytes_per_token: float) -> dict:
    """Mean loss over the validation blocks, each counted once (`gather_for_metrics` drops the padding
    copies). Every block has as many targets, so the mean of the blocks' means is exact."""
    model.eval()
    losses, full = [], None
    for batch in eval_dataloader:  # always to the end (see data.make_dataloaders)
        ids, blocks = batch["input_ids"], batch["input_ids"].shape[0]
        full = full or blocks
        # A short last batch is topped up with copies of its first block, scored and dropped: one shape, so
        # that --torch_compile does not compile the forward again for it.
        padded = torch.cat([ids, ids[:1].expand(full - blocks, -1)]) if blocks < full else ids
        logits = model(input_ids=padded, use_cache=False).logits[:blocks, :-1].float()  # float32, as the loss
        per_token = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
        )
        losses.append(accelerator.gather_for_metrics(per_token.view(blocks, -1).mean(dim=1)))
    model.train()
    losses = torch.cat(losses)
    mean_loss = losses.double().mean().item()
    return {
        "eval_loss": mean_loss,
        "perplexity": perplexity(mean_loss),
        # bits per byte = total nats / (ln 2 * total bytes), with bytes = tokens *
        # (bytes per validation token)
        "bits_per_byte": mean_loss / (math.log(2) * bytes_per_token),
        "eval_tokens": len(losses) * (ids.shape[1] - 1),
    }


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 50 else float("inf")


# ---- beyond the loss: the probes and samples

@dataclass
class ProbeReport:
    """Each probe kind's accuracy beside what guessing scores, and samples, for the log and the model card."""

    accuracy: dict[str, float] = field(default_factory=dict)
    chance: dict[str, float] = field(default_factory=dict)  # hf_tinytx.probes.chance_levels
    # (the prompt's last 80 characters, completion)
    samples: list[tuple[str, str]] = field(default_factory=list)
    coref_head: dict | None = None  # the head that resolves "it" (`find_coref_head`)


def find_coref_head(model, tokenizer, probes) -> dict:
    """The head whose attention, from the last "The" of a coreference probe, leans most to the noun "it"
    means, and its attention map on the first probe: what the card draws."""
    from hf_tinytx.interpret.attention_maps import attention_maps
    from hf_tinytx.interpret.head_roles import coref_head_scores, rank_heads

    scores = coref_head_scores(model, tokenizer, probes, query="last")
    best = rank_heads(scores["score"], top=1)[0]
    layer, head = best.layer, best.head
    example = attention_maps(model, tokenizer, probes[0].prompt)
    return {"layer": layer, "head": head, "probes": len(probes), "example": probes[0].prompt,
            **{key: float(scores[key][layer, head]) for key in ("referent", "other", "agreement")},
            "tokens": example.tokens, "weights": example.weights[layer, head].tolist()}


def own_text_prompts(data_args, validation, tokenizer, count: int) -> list[str] | None:
    """The samples' prompts for a run on the user's text: its validation documents' first words (None for the
    built-in corpus, whose probes test what it was written to teach)."""
    if not (data_args.train_file or data_args.dataset_name):
        return None
    return [tokenizer.decode(ids) for ids in document_starts(iter(validation), tokenizer.eos_token_id, count)]


def run_probes_and_samples(model, tokenizer, train_args, accelerator, own_prompts: list[str] | None = None):
    """Probe accuracies and a few greedy generations; a run on other text gets samples from its own validation
    documents (`own_prompts`) instead of probes."""
    report = ProbeReport()
    if own_prompts is not None:
        if train_args.num_probes_per_kind > 0:
            accelerator.print(
                "No probes: they test what the built-in corpus teaches (coreference, recall, copying), not "
                "this text; the samples below continue its validation documents."
            )
        prompts = own_prompts[: train_args.num_samples]
    elif train_args.num_probes_per_kind <= 0 and train_args.num_samples <= 0:
        return report
    else:
        probes = make_probes(num_per_kind=max(train_args.num_probes_per_kind, 1))
        model.eval()
        if train_args.num_probes_per_kind > 0:
            scores = score_probes(model, tokenizer, probes, batch_size=train_args.per_device_eval_batch_size)
            report.accuracy = {name: value for name, value in scores.items() if not name.startswith("n_")}
            report.chance = chance_levels(probes)
            accelerator.print(
                "probe accuracy: "
                + ", ".join(
                    f"{name} {value:.3f} (chance {report.chance[name]:.2f})"
                    for name, value in report.accuracy.items()
                )
            )
            head = report.coref_head = find_coref_head(
                model, tokenizer, [p for p in probes if p.kind == "coref"]
            )
            accelerator.print(
                f"the head that resolves \"it\": layer {head['layer']} head {head['head']}; from the last "
                f"\"The\" it puts {head['referent']:.2f} of its attention on the noun \"it\" means and "
                f"{head['other']:.2f} on the other ({head['agreement']:.0%} of {head['probes']} sentences "
                "lean the right way)"
            )
        prompts = []
        for kind in ("coref", "copy", "coref_new_nouns", "recall"):
            prompts += [probe.prompt for probe in probes if probe.kind == kind][:1]
    model.eval()  # (already, after the probes)
    for prompt in prompts[: train_args.num_samples]:
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
        completion = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        report.samples.append((prompt[-80:], completion))
        accelerator.print(f"sample: ...{prompt[-80:]!s}[{completion}]")
    return report
