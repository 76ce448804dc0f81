# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Looking inside TinyTx (or any transformers causal LM with eager attention): attention maps per layer and
head (:mod:`.attention_maps`), a score per head for positional, induction and coreference roles
(:mod:`.head_roles`), and numerical checks of how attention sees position (:mod:`.position_checks`).

The command (__main__.py): ``python -m hf_tinytx.interpret MODEL "text" --out DIR``. Drawing needs matplotlib.
"""

from hf_tinytx.interpret.attention_maps import (
    attention_maps,
    attention_weights,
    eager_attention,
    render_attention_map,
    save_attention_maps,
)
from hf_tinytx.interpret.head_roles import (
    coref_head_scores,
    find_heads,
    first_token_scores,
    induction_baseline,
    induction_scores,
    induction_targets,
    positional_head_scores,
    previous_token_scores,
    uniform_baseline,
)
from hf_tinytx.interpret.position_checks import permutation_check, rotary_separation_check


__all__ = [
    "attention_maps", "attention_weights", "coref_head_scores", "eager_attention", "find_heads",
    "first_token_scores", "induction_baseline", "induction_scores", "induction_targets", "permutation_check",
    "positional_head_scores", "previous_token_scores", "render_attention_map", "rotary_separation_check",
    "save_attention_maps", "uniform_baseline",
]
