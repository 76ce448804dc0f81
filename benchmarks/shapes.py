"""The model shapes the benchmarks compare, in a module of their own without torch: the
scripts' flags read them before torch loads."""

# name -> (TinyTx config fields, batch size, sequence length)
SHAPES = {
    # ~0.8M parameters: nanoGPT's Shakespeare-char scale (65 characters).
    "0.8M": (
        dict(
            vocab_size=65, hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=4
        ),
        12,
        64,
    ),
    # ~10M parameters with a small BPE vocabulary and tied embeddings.
    "10M": (
        dict(
            vocab_size=4096, hidden_size=384, intermediate_size=1024, num_hidden_layers=5,
            num_attention_heads=6, tie_word_embeddings=True,
        ),
        8,
        256,
    ),
}
