"""The sizes a planned run chooses between, and the recipe they train with.

Each rung is a TinyTxConfig shape (gated SiLU MLP of ~2.7x the width, heads of 32 to 64), about twice the
blocks of the one before. The smallest is the default run's micro model. The recipe is the one tuned on Tiny
Shakespeare (benchmarks/results/shakespeare_sweep.txt): Muon on the block matrices, AdamW on the rest, a
30-step warm-up, cosine on the clock; its weight decay depends on how often the text is read (choose.py).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    preset: str = "tiny"  # the training/configs/ file the shape overrides (micro ties its embeddings)

    def parameters(self, vocab: int) -> int:
        """Weights at this vocabulary: the embeddings (twice when untied), the blocks and the final norm."""
        block = 4 * self.hidden * self.hidden + 3 * self.hidden * self.intermediate + 2 * self.hidden
        embeddings = (1 if self.preset == "micro" else 2) * vocab * self.hidden
        return embeddings + self.layers * block + self.hidden

    def flags(self) -> dict:
        """pretrain.py's flags that build this size."""
        return {"model_preset": self.preset, "hidden_size": self.hidden,
                "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.heads}


LADDER = (
    Size("micro", 64, 192, 2, 4, preset="micro"),
    Size("96x3", 96, 256, 3, 3),
    Size("128x4", 128, 352, 4, 4),
    Size("192x4", 192, 512, 4, 4),
    Size("256x5", 256, 688, 5, 4),
    Size("320x6", 320, 864, 6, 5),
    Size("384x8", 384, 1024, 8, 6),
    Size("512x8", 512, 1376, 8, 8),
    Size("768x12", 768, 2048, 12, 12),
)

VOCAB = 1024  # swept on Tiny Shakespeare: 512 and 1,024 alike, 2,048 worse at 160 s
RECIPE = {"optimizer": "muon", "learning_rate": 3e-3, "muon_learning_rate": 2e-2, "num_warmup_steps": 30}
BATCH, BLOCK = 16, 128  # sequences per step and tokens per sequence, as swept


def by_name(name: str) -> Size:
    for size in LADDER:
        if size.name == name:
            return size
    raise KeyError(name)
