"""The validation loss of a run (and perplexity, bits per byte): every block counted once, on any process count."""

import math

import torch


@torch.no_grad()
def validation_metrics(model, eval_dataloader, accelerator, bytes_per_token: float) -> dict:
    """Mean loss over the validation blocks, each counted once (`gather_for_metrics` drops the padding copies). Every
    block has as many targets, so the mean of the blocks' means is exact."""
    model.eval()
    losses, full = [], None
    for batch in eval_dataloader:  # always to the end (see data.make_dataloaders)
        ids, blocks = batch["input_ids"], batch["input_ids"].shape[0]
        full = full or blocks
        # A short last batch is topped up with copies of its first block, scored and dropped: one shape, so that
        # --torch_compile does not compile the forward again for it.
        padded = torch.cat([ids, ids[:1].expand(full - blocks, -1)]) if blocks < full else ids
        logits = model(input_ids=padded, use_cache=False).logits[:blocks, :-1].float()  # float32, as the loss
        per_token = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        losses.append(accelerator.gather_for_metrics(per_token.view(blocks, -1).mean(dim=1)))
    model.train()
    losses = torch.cat(losses)
    mean_loss = losses.double().mean().item()
    return {
        "eval_loss": mean_loss,
        "perplexity": perplexity(mean_loss),
        # bits per byte = total nats / (ln 2 * total bytes), with bytes = tokens * (bytes per validation token)
        "bits_per_byte": mean_loss / (math.log(2) * bytes_per_token),
        "eval_tokens": len(losses) * (ids.shape[1] - 1),
    }


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 50 else float("inf")
