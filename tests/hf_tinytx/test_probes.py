"""The probe scorer: right keys and ranges on a random TinyTx, exact bookkeeping proven with an oracle model
that knows every answer, and batching/padding that does not change a single score."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast
from transformers.modeling_outputs import CausalLMOutput

from hf_tinytx import TinyTxConfig, TinyTxForCausalLM
from hf_tinytx.corpus import generate_documents, make_probes
from hf_tinytx.probes import candidate_log_probs, score_probes


@pytest.fixture(scope="module")
def tokenizer():
    """A small byte-level BPE learned from the corpus itself, as a transformers tokenizer."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(generate_documents(300, seed=0), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    torch.manual_seed(0)
    config = TinyTxConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=2048, bos_token_id=None, eos_token_id=None,
    )
    return TinyTxForCausalLM(config)


@pytest.fixture(scope="module")
def probes():
    return make_probes(num_per_kind=4, seed=1, recall_distances=(10, 50), copy_distances=(0, 20))


class OracleLM(torch.nn.Module):
    """Knows a set of token sequences: wherever the input so far is a prefix of one, it puts a high logit on
    that sequence's next token. Fed the prompt+answer sequences, a correct scorer must find every answer."""

    def __init__(self, sequences: list[list[int]], vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.next_token = {tuple(seq[: t + 1]): seq[t + 1] for seq in sequences for t in range(len(seq) - 1)}

    def forward(self, input_ids):  # no attention_mask: right padding needs none, and the scorer must cope
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        for row, ids in enumerate(input_ids.tolist()):
            for t in range(len(ids)):
                token = self.next_token.get(tuple(ids[: t + 1]))
                if token is not None:
                    logits[row, t, token] = 20.0
        return CausalLMOutput(logits=logits)


def _oracle(tokenizer, probes, pick) -> OracleLM:
    sequences = [tokenizer(probe.prompt + pick(probe))["input_ids"] for probe in probes]
    return OracleLM(sequences, len(tokenizer))


def test_scores_have_the_right_keys_and_ranges(tiny_model, tokenizer, probes):
    tiny_model.train()
    results = score_probes(tiny_model, tokenizer, probes, batch_size=8)
    keys = ["coref", "coref_new_nouns", "recall@10", "recall@50", "copy", "copy@20"]
    assert set(results) == set(keys) | {f"n_{key}" for key in keys}
    for key in keys:
        assert isinstance(results[key], float) and 0.0 <= results[key] <= 1.0
        assert results[f"n_{key}"] == 4.0
    assert tiny_model.training, "the scorer must hand the model back in the mode it found it"


@pytest.mark.parametrize("knows, batch_size, score", [("answer", 5, 1.0), ("distractor", 3, 0.0)])
def test_an_oracle_scores_100_percent_or_0_when_it_prefers_a_distractor(
    tokenizer, probes, knows, batch_size, score
):
    oracle = _oracle(tokenizer, probes, lambda p: p.answer if knows == "answer" else p.distractors[-1])
    results = score_probes(oracle, tokenizer, probes, batch_size=batch_size)
    assert all(results[key] == score for key in results if not key.startswith("n_"))


def test_log_probs_match_a_plain_forward_pass_and_ignore_batching(tiny_model, tokenizer, probes):
    batched = candidate_log_probs(tiny_model, tokenizer, probes, batch_size=16)
    in_pairs = candidate_log_probs(tiny_model, tokenizer, probes, batch_size=2)
    assert torch.allclose(torch.tensor(sum(batched, [])), torch.tensor(sum(in_pairs, [])), atol=1e-4)

    # By hand, for one recall probe: no padding, every position's logits, candidate tokens after the prompt's.
    probe = next(p for p in probes if p.kind == "recall")
    for candidate, score in zip((probe.answer, *probe.distractors), batched[probes.index(probe)]):
        context = tokenizer(probe.prompt)["input_ids"]
        full = tokenizer(probe.prompt + candidate)["input_ids"]
        assert full[: len(context)] == context  # " 4 7 1" does not merge into the prompt's last token
        with torch.no_grad():
            log_probs = torch.log_softmax(tiny_model(torch.tensor([full])).logits[0], dim=-1)
        expected = sum(log_probs[t - 1, full[t]].item() for t in range(len(context), len(full)))
        assert score == pytest.approx(expected, abs=1e-4)


def test_candidate_tokens_are_split_after_the_common_prefix(tokenizer):
    # Without a leading space the candidate merges with the prompt's last word ("Aga" + "in" -> one "Again"
    # token), so the candidate's tokens start before the candidate's text does.
    from hf_tinytx.probes import _split_candidate

    prompt, candidate = "Repeat: tiger. Aga", "in:"
    prompt_ids = tokenizer(prompt)["input_ids"]
    full_ids = tokenizer(prompt + candidate)["input_ids"]
    context, tokens = _split_candidate(prompt_ids, full_ids, prompt, candidate)
    assert context + tokens == full_ids
    assert context == prompt_ids[: len(context)] and len(context) < len(prompt_ids)


def test_empty_probe_list_is_an_error(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="make_probes"):
        score_probes(tiny_model, tokenizer, [])
    with pytest.raises(ValueError, match="batch_size"):
        score_probes(tiny_model, tokenizer, make_probes(1, recall_distances=()), batch_size=0)


def test_a_tokenizer_that_adds_bos_gets_it_in_front_of_every_probe(tokenizer, probes):
    # Llama-style tokenizers put <s> before every text; the scorer must do the same, or an oracle trained on
    # such text would not recognise the probes.
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.add_special_tokens(["<s>"])
    bos_id = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos_id)])
    with_bos = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>")
    assert with_bos("The")["input_ids"][0] == bos_id
    results = score_probes(_oracle(with_bos, probes, lambda p: p.answer), with_bos, probes, batch_size=4)
    assert all(results[key] == 1.0 for key in results if not key.startswith("n_"))
