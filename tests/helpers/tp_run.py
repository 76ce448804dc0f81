"""Loads a TinyTx folder, with transformers' tensor-parallel plan when run under
torchrun, and writes what it computed.

    torchrun --nproc_per_node 2 tests/helpers/tp_run.py FOLDER OUT_PREFIX     # TP plan "auto": weights
        sharded
    python tests/helpers/tp_run.py FOLDER OUT_PREFIX                          # one process, the reference
    torchrun ... tests/helpers/tp_run.py FOLDER OUT_PREFIX
    '{"model.layers.*.self_attn.k_proj": "unit_colwise"}'
                                                                     # the plan with these rules
                                                                     over the config's

Writes OUT_PREFIX.rankR.pt: the logits of a fixed batch, greedy new tokens, and the local weight shape and
placement of each linear layer of the first decoder layer and the head.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import hf_tinytx  # noqa: F401  (registers "tinytx" with the Auto classes)


def main(folder: str, prefix: str, plan: str = '"auto"') -> None:
    distributed = "WORLD_SIZE" in os.environ
    options = {}
    if distributed:
        try:  # transformers >= 5.17; before it, the tp_plan argument alone
            from transformers import DistributedConfig

            options = {"distributed_config": DistributedConfig(tp_plan=json.loads(plan))}
        except ImportError:
            options = {"tp_plan": "auto"}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **options).eval()
    rank = dist.get_rank() if distributed else 0
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 24), generator=generator)
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
        tokens = model.generate(input_ids=input_ids[:1, :8], max_new_tokens=12, do_sample=False,
                                pad_token_id=model.config.pad_token_id)
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and (".layers.0." in name or name == "lm_head"):
            weight = module.weight
            placement = str(weight.placements[0]) if hasattr(weight, "placements") else "unsharded"
            local = weight.to_local() if hasattr(weight, "to_local") else weight
            layers[name] = {"local_shape": tuple(local.shape), "placement": placement}
    torch.save({"logits": logits.to_local() if hasattr(logits, "to_local") else logits, "tokens": tokens,
                "layers": layers}, f"{prefix}.rank{rank}.pt")
    if distributed:  # leaving with gloo's threads still running can abort the process at exit
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
