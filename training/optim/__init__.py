"""The optimizer (AdamW, or Muon with AdamW) and the learning-rate schedule over steps or a clock."""
