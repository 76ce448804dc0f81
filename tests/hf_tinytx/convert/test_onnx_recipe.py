"""docs/serving.md's ONNX and `torch.export` recipe as a user runs it: the export block, then the
onnxruntime loop, read from the page (not copied here) and run in one Python process in a user's
folder that holds `out/tinytx`, a tiny model that learned a few sentences (serve/test_serve.py), so
that greedy tokens are not near-ties."""

import subprocess
import sys

import pytest

from tests.hf_tinytx.serve.test_serve import train_tiny_chat_model
from tests.test_readme import section_block


pytestmark = pytest.mark.deep

pytest.importorskip("onnxruntime", reason="the onnx extra (pip install -e '.[test]') installs onnxruntime")

PAGE, SECTION = "docs/serving.md", "ONNX and `torch.export`"

# What the page promises, checked after its two blocks ran: `model`, `example` and `program` are the export
# block's, `session` and `ids` the onnxruntime block's.
CHECK = """
import numpy as np
expected = model.generate(example, max_new_tokens=20, do_sample=False, eos_token_id=None)
assert ids.tolist() == expected.tolist(), (ids.tolist(), expected.tolist())
for length in (2, 9, example.shape[1]):
    generator = torch.Generator().manual_seed(length)
    x = torch.randint(3, model.config.vocab_size, (1, length), generator=generator)
    with torch.no_grad():
        reference = model(x).logits
        assert torch.equal(program.module()(x), reference), length
    onnx_logits = session.run(None, {"input_ids": x.numpy()})[0]
    assert np.abs(onnx_logits - reference.numpy()).max() < 1e-4, length
print("recipe ok")
"""


def test_onnx_and_torch_export_recipe_runs_as_written(tmp_path):
    model, tokenizer = train_tiny_chat_model(stopping=("completion",))
    model.save_pretrained(tmp_path / "out" / "tinytx")
    tokenizer.save_pretrained(tmp_path / "out" / "tinytx")
    export = section_block(PAGE, SECTION, "python", "torch.onnx.export")
    run = section_block(PAGE, SECTION, "python", "onnxruntime.InferenceSession")
    result = subprocess.run([sys.executable, "-c", export + run + CHECK], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "recipe ok" in result.stdout
    assert (tmp_path / "out" / "tinytx.onnx").stat().st_size > 0
