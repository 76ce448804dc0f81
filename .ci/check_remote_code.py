"""Checks that a saved TinyTx folder loads as remote code
(`trust_remote_code=True`) where hf_tinytx is absent.

Two steps, usually run by two different Python environments:

    python .ci/check_remote_code.py save FOLDER    # needs hf_tinytx; saves a tiny model and reference outputs
    python .ci/check_remote_code.py check FOLDER   # hf_tinytx is blocked; loads FOLDER as remote code and
                                                   # compares

`.ci/run` saves with the project's environment and checks with one that has the oldest supported transformers,
so the code files copied into every checkpoint keep working on every release pyproject.toml allows.
"""

import os
import sys
import tempfile


REFERENCE_FILE = "reference_outputs.safetensors"  # ignored by from_pretrained, which reads model.safetensors
NEW_TOKENS = 16


def save(folder):
    import torch
    from safetensors.torch import save_file

    import hf_tinytx

    torch.manual_seed(0)
    # Grouped-query attention, qk_norm and tied embeddings: the code paths a plain
    # Llama checkpoint would not cover.
    config = hf_tinytx.TinyTxConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, qk_norm=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    )
    model = hf_tinytx.TinyTxForCausalLM(config).eval()
    model.save_pretrained(folder)

    input_ids = torch.randint(3, config.vocab_size, (2, 10))
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    generated = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
    )
    save_file(
        {"input_ids": input_ids, "logits": logits.contiguous(), "generated": generated},
        os.path.join(folder, REFERENCE_FILE),
    )
    print(f"saved a TinyTx model and reference outputs to {folder}")


class BlockHfTinytx:
    """Import hook that makes `import hf_tinytx` fail, as on a machine where the package is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "hf_tinytx" or name.startswith("hf_tinytx."):
            raise ImportError(f"{name} is blocked: this check must load the model as remote code")
        return None


def check(folder):
    sys.meta_path.insert(0, BlockHfTinytx())
    # A private cache for the dynamic modules, so the user's ~/.cache/huggingface is neither read nor written.
    os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="tinytx-remote-code-"))

    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    try:
        import hf_tinytx  # noqa: F401
    except ImportError:
        pass
    else:
        sys.exit("FAIL: hf_tinytx is importable here, so this would not test remote code")

    reference = load_file(os.path.join(folder, REFERENCE_FILE))
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    module = type(model).__module__
    if not module.startswith("transformers_modules."):
        sys.exit(f"FAIL: the model class comes from {module!r}, not from the folder's remote code")

    input_ids = reference["input_ids"]
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    # Other releases may pick another attention kernel or mask path: tiny float
    # differences are fine, new argmaxes not.
    torch.testing.assert_close(logits, reference["logits"], rtol=1e-5, atol=1e-5)
    generated = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
    )
    if not torch.equal(generated, reference["generated"]):
        sys.exit(
            f"FAIL: greedy generation differs from the reference:\n{generated}\nvs\n{reference['generated']}"
        )
    max_diff = (logits - reference["logits"]).abs().max().item()
    print(
        f"remote code OK on transformers {transformers.__version__} (torch {torch.__version__}): class from "
        f"{module}, max |logit difference| {max_diff:.2e}, {NEW_TOKENS} greedy tokens identical"
    )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("save", "check"):
        sys.exit("usage: python .ci/check_remote_code.py {save,check} FOLDER")
    if sys.argv[1] == "save":
        save(sys.argv[2])
    else:
        check(sys.argv[2])
