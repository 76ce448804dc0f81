"""A GPT of nanoGPT's shape, written here for the speed comparison in benchmarks/train_step.py.

nanoGPT is a script, not a package, so this is our own code with its design: learned position embeddings,
LayerNorm, one fused query/key/value projection, a GELU MLP four times as wide,
`scaled_dot_product_attention`, and the output layer tied to the token embedding. Nothing of transformers runs
here: it is the bare-PyTorch baseline a TinyTx training step is measured against.
"""

from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm_1, self.norm_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, width: int, layers: int, heads: int, max_length: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(max_length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight
        for parameter in self.parameters():
            if parameter.dim() == 2:
                nn.init.normal_(parameter, std=0.02)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        """The same loss as a transformers causal LM: position t predicts token t + 1."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return SimpleNamespace(loss=loss, logits=logits)
