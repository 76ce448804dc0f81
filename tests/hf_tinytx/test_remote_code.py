"""A saved TinyTx folder loads with `trust_remote_code=True` in a Python where `import hf_tinytx` fails."""

import json
import os
import subprocess
import sys
import textwrap

import torch
from safetensors.torch import save_file

import hf_tinytx
from tests.helpers.remote_code import BLOCK_HF_TINYTX
from tests.helpers.tiny import build_tiny_config, greedy


NEW_TOKENS = 16

# Runs in the child. The import hook stands in for a machine without the package: even where hf_tinytx is
# installed (editable, as in CI), every attempt to import it fails.
CHILD_SCRIPT = BLOCK_HF_TINYTX + textwrap.dedent(
    """
    import hashlib, inspect, json, os, sys

    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        import hf_tinytx
        hf_tinytx_importable = True
    except ImportError:
        hf_tinytx_importable = False

    folder, reference_file = sys.argv[1], sys.argv[2]
    reference = load_file(reference_file)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    input_ids = reference["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
    generated = model.generate(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=%(new_tokens)d,
        min_new_tokens=%(new_tokens)d, do_sample=False, pad_token_id=0,
    )
    print(json.dumps({
        "hf_tinytx_importable": hf_tinytx_importable,
        "loaded_modules": sorted(name for name in sys.modules if name.startswith("hf_tinytx")),
        "model_module": type(model).__module__,
        "config_module": type(AutoConfig.from_pretrained(folder, trust_remote_code=True)).__module__,
        "model_file": inspect.getfile(type(model)),
        "logits_identical": bool(torch.equal(logits, reference["logits"])),
        "max_logit_difference": (logits - reference["logits"]).abs().max().item(),
        "generated": generated.tolist(),
    }))
    """
    % {"new_tokens": NEW_TOKENS}
)


def run_without_the_package(script: str, tmp_path, *args, cwd=None, **env) -> subprocess.CompletedProcess:
    """`script args` in a child with private caches (the user's ~/.cache/huggingface is neither read nor
    written) and no path to the repository."""
    path = tmp_path / "child.py"
    path.write_text(script)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", **env)
    result = subprocess.run(
        [sys.executable, str(path), *map(str, args)], cwd=cwd or tmp_path, env=environment,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_saved_folder_loads_as_remote_code_without_the_package(tmp_path):
    torch.manual_seed(0)
    # qk_norm and GQA exercise the code paths a Llama model lacks, so nothing can
    # be borrowed from transformers.
    config = build_tiny_config(qk_norm=True, initializer_range=0.2)
    model = hf_tinytx.TinyTxForCausalLM(config).eval()
    folder = tmp_path / "tiny_tinytx"
    model.save_pretrained(folder)
    assert (folder / "modeling_tinytx.py").is_file() and (folder / "configuration_tinytx.py").is_file()
    assert "auto_map" in json.loads((folder / "config.json").read_text())

    input_ids = torch.randint(3, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
    expected_tokens = greedy(model, input_ids, NEW_TOKENS)
    reference_file = tmp_path / "reference.safetensors"
    save_file({"input_ids": input_ids, "logits": logits.contiguous()}, reference_file)
    modules_cache, workdir = tmp_path / "hf_modules", tmp_path / "elsewhere"
    workdir.mkdir()
    result = run_without_the_package(CHILD_SCRIPT, tmp_path, folder, reference_file, cwd=workdir,
                                     HF_MODULES_CACHE=str(modules_cache))
    report = json.loads(result.stdout.strip().splitlines()[-1])

    assert report["hf_tinytx_importable"] is False
    assert report["loaded_modules"] == []
    assert report["model_module"].startswith("transformers_modules.")
    assert report["model_module"].endswith(".modeling_tinytx")
    assert report["config_module"].startswith("transformers_modules.")
    assert report["model_file"].startswith(str(modules_cache))
    assert report["logits_identical"], f"max |difference| {report['max_logit_difference']}"
    assert report["generated"] == expected_tokens.tolist()
    assert len(report["generated"][0]) == input_ids.shape[1] + NEW_TOKENS


TOKENIZER_SCRIPT = BLOCK_HF_TINYTX + textwrap.dedent(
    """
    import json, sys
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder, text = sys.argv[1], sys.argv[2]
    fast = PreTrainedTokenizerFast.from_pretrained(folder)
    auto = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    print(json.dumps({"fast": fast(text).input_ids, "auto": auto(text).input_ids,
                      "hf_tinytx_loaded": any(name.startswith("hf_tinytx") for name in sys.modules)}))
    """
)


def test_a_saved_tokenizer_loads_without_the_package_and_without_a_prompt(tmp_path):
    """The README's two ways to load a trained folder's tokenizer where hf_tinytx is not
    installed. No stdin: if either asked "Do you wish to run the custom code?", its answer would
    be EOF and AutoTokenizer would log that."""
    from tests.helpers.tiny import build_byte_bpe_tokenizer

    folder = tmp_path / "tiny_tinytx"
    hf_tinytx.TinyTxForCausalLM(build_tiny_config()).save_pretrained(folder)
    tokenizer = build_byte_bpe_tokenizer()
    tokenizer.save_pretrained(folder)
    text = "The quick brown fox"
    result = run_without_the_package(TOKENIZER_SCRIPT, tmp_path, folder, text)
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["fast"] == report["auto"] == tokenizer(text).input_ids
    assert report["hf_tinytx_loaded"] is False
