# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Looking inside TinyTx (or any transformers causal LM with eager attention).

* :mod:`.attention_maps`: attention weights of a text, drawn as labelled heatmaps per layer and head;
* :mod:`.head_roles`: a score per head for previous-token, first-token, induction (lookup) and coreference roles;
* :mod:`.position_checks`: numerical checks of permutation invariance and of rotary relative positions.

Command line: ``python -m hf_tinytx.interpret MODEL "text" --out DIR`` (see ``--help``). Drawing needs matplotlib,
which is not one of hf_tinytx's own dependencies.
"""

from .attention_maps import (
    AttentionMaps,
    attention_maps,
    attention_weights,
    eager_attention,
    render_attention_map,
    save_attention_maps,
    token_labels,
)
from .head_roles import (
    RankedHead,
    coref_head_scores,
    find_heads,
    first_token_scores,
    induction_baseline,
    induction_scores,
    induction_targets,
    positional_head_scores,
    previous_token_scores,
    rank_heads,
    uniform_baseline,
)
from .position_checks import PositionCheck, permutation_check, rotary_separation_check


__all__ = [
    "AttentionMaps", "PositionCheck", "RankedHead", "attention_maps", "attention_weights", "coref_head_scores",
    "eager_attention", "find_heads", "first_token_scores", "induction_baseline", "induction_scores",
    "induction_targets", "permutation_check", "positional_head_scores", "previous_token_scores", "rank_heads",
    "render_attention_map", "rotary_separation_check", "save_attention_maps", "token_labels", "uniform_baseline",
]
