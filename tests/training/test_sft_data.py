"""Fine-tuning data in, rows out, nothing lost unsaid: what max_seq_length cuts or drops is counted
(training/sft/data.py RowCounts), and input the tokenizer cannot take (a lone surrogate, a chat template that raises
or does not parse) is refused in one line naming the file and line."""

import json
import math
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.sft.data import IGNORE_INDEX, build_examples, ensure_chat_template, tokenize_record
from hf_tinytx_training.sft.records import read_records


ROW = 32  # max_seq_length of these tests
LONG = "word " * 100  # ~300 tokens: three times a row and more


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def short_records(n: int) -> list[dict]:
    return [{"prompt": f"Q: add {i} and {i + 1}\nA:", "response": f" {2 * i + 1}"} for i in range(n)]


def test_padded_rows_count_what_is_cut_and_what_is_dropped(tmp_path, byte_bpe_tokenizer):
    """51 records -> 50 rows: two long ones are cut (and kept), one whose prompt fills the row is dropped."""
    tokenizer = byte_bpe_tokenizer()
    long_reply = {"prompt": "Q: say word\nA:", "response": LONG}
    long_prompt = {"prompt": LONG, "response": " 3"}
    path = write_jsonl(tmp_path / "train.jsonl", [*short_records(48), long_reply, long_prompt])
    (tmp_path / "more.txt").write_text(LONG + "\n")
    records = read_records(str(path)) + read_records(str(tmp_path / "more.txt"))
    whole = [tokenize_record(record, tokenizer) for record in records]
    assert all(len(example["input_ids"]) <= ROW for example in whole[:48])  # the short ones fit
    assert all(len(example["input_ids"]) > ROW for example in whole[48:])

    rows = build_examples(records, tokenizer, max_seq_length=ROW, packing=False)
    counts = rows.counts
    longest = max(len(example["input_ids"]) for example in whole)
    assert (counts.records, counts.rows, counts.cut, counts.dropped, counts.empty) == (51, 50, 3, 1, 0)
    assert counts.tokens == sum(len(example["input_ids"]) for example in whole) and counts.longest == longest
    assert counts.kept_tokens == sum(len(example["input_ids"]) for example in whole[:48]) + 2 * ROW
    # The cut records keep their first ROW tokens; the one whose prompt fills the row is gone.
    assert rows[48]["input_ids"] == whole[48]["input_ids"][:ROW]
    assert rows[49]["input_ids"] == whole[50]["input_ids"][:ROW]
    assert rows[:48]["input_ids"] == [example["input_ids"] for example in whole[:48]]
    assert counts.summary("train.jsonl", ROW, packing=False) == (
        f"train.jsonl: 3 of 51 records were cut to --max_seq_length 32 tokens (the longest has {longest}); 1 of them "
        "dropped because the prompt fills the row; raise --max_seq_length (up to the model's context) or shorten "
        "those records to train on all of them."
    )
    # Nothing cut: nothing to say.
    fitting = build_examples(records[:48], tokenizer, max_seq_length=ROW, packing=False)
    assert fitting.counts.summary("train.jsonl", ROW, packing=False) is None
    assert (fitting.counts.rows, fitting.counts.cut, fitting.counts.dropped) == (48, 0, 0)


def test_packed_rows_count_every_token_and_the_prompt_only_rows_dropped(byte_bpe_tokenizer):
    tokenizer = byte_bpe_tokenizer()
    records = [{"kind": "prompt", "prompt": LONG, "response": " 3"}] + [
        {"kind": "prompt", **record} for record in short_records(20)
    ]
    whole = [tokenize_record(record, tokenizer) for record in records]
    stream = [token for example in whole for token in example["input_ids"]]
    prompt_tokens = whole[0]["labels"].index(next(label for label in whole[0]["labels"] if label != IGNORE_INDEX))
    # The rows inside the first record's prompt learn nothing: those are the ones dropped.
    dropped = prompt_tokens // ROW
    rows = build_examples(records, tokenizer, max_seq_length=ROW, packing=True)
    counts = rows.counts
    assert dropped >= 9 and (counts.records, counts.dropped, counts.cut) == (21, dropped, 0)
    assert counts.rows == len(rows) == math.ceil(len(stream) / ROW) - dropped
    assert counts.tokens == len(stream) and counts.kept_tokens == len(stream) - dropped * ROW
    assert [token for row in rows["input_ids"] for token in row] == stream[dropped * ROW :]  # the rest, all of it
    assert counts.summary("train.jsonl", ROW, packing=True) == (
        f"train.jsonl: packed 21 records ({len(stream)} tokens) into {counts.rows} rows of at most 32 tokens; "
        f"{dropped} rows holding only prompt tokens ({dropped * ROW} tokens) were dropped."
    )
    fitting = build_examples(records[1:], tokenizer, max_seq_length=ROW, packing=True)
    assert fitting.counts.summary("t.jsonl", ROW, packing=True).endswith("rows of at most 32 tokens; no token was "
                                                                          "dropped.")


def test_finetune_refuses_data_of_which_every_record_would_be_dropped(byte_bpe_tokenizer):
    from hf_tinytx_training.finetune import to_dataset

    records = [{"kind": "prompt", "prompt": LONG, "response": " 3", "where": "train.jsonl, line 1"}]
    with pytest.raises(UserInputError, match=r"^No example in train.jsonl keeps a token to learn within "
                                             r"--max_seq_length 32 \(the prompts fill the whole row\)"):
        to_dataset(records, byte_bpe_tokenizer(), ROW, False, "train.jsonl")


@pytest.mark.parametrize(
    "record, what",
    [
        ({"prompt": "\ud800", "response": "A"}, '"prompt" holds a lone surrogate \\ud800 at character 1'),
        ({"prompt": "Q", "response": "ok \udfff"}, '"response" holds a lone surrogate \\udfff at character 4'),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x\ud83d"}]},
         'message 1\'s "content" holds a lone surrogate \\ud83d at character 2'),
    ],
    ids=["prompt", "response", "chat"],
)
def test_a_lone_surrogate_is_refused_with_its_file_and_line(tmp_path, record, what):
    """json.dumps writes the surrogate as the escape a user's file would hold (ensure_ascii): valid JSON, not text."""
    path = write_jsonl(tmp_path / "train.jsonl", [short_records(1)[0], record])
    assert "\\ud" in path.read_text()  # the file holds the escape, as ASCII
    with pytest.raises(UserInputError) as refused:
        read_records(str(path))
    assert str(refused.value) == (
        f"{path}, line 2: {what} (half of a UTF-16 pair, written as a JSON escape), which is not text; write the "
        "character itself, or both halves of its pair (e.g. \\ud83d\\ude00)."
    )


def test_a_whole_surrogate_pair_is_text(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "smile \\ud83d\\ude00", "response": "ok"}\n')
    assert read_records(str(path))[0]["prompt"] == "smile \U0001F600"


BAD_TEMPLATES = {
    "raises": ("{% if messages|length > 2 %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
               "{% for m in messages %}{{ m['content'] + eos_token }}{% endfor %}",
               "failed on this conversation (TemplateError: Conversation roles must alternate)"),
    "does_not_parse": ("{% for m in messages %}\n{{ m['content'] }\n{% endfor %}",
                       "does not parse (unexpected '}', template line 2)"),
}


def templated_tokenizer(folder: Path, template: str, byte_bpe_tokenizer):
    """Saved and loaded again, as finetune loads a model folder's tokenizer: the template in chat_template.jinja."""
    tokenizer = byte_bpe_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_a_chat_template_that_raises_names_its_file_and_the_record(tmp_path, byte_bpe_tokenizer):
    template, problem = BAD_TEMPLATES["raises"]
    tokenizer = templated_tokenizer(tmp_path / "base", template, byte_bpe_tokenizer)
    assert not ensure_chat_template(tokenizer)  # it parses: the model's own template is kept
    short = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    longer = {"messages": [*short["messages"], {"role": "user", "content": "again"},
                           {"role": "assistant", "content": "hello"}]}
    path = write_jsonl(tmp_path / "chat.jsonl", [short, longer])
    records = read_records(str(path))
    assert len(build_examples(records[:1], tokenizer, max_seq_length=ROW, packing=False)) == 1
    with pytest.raises(UserInputError) as refused:
        build_examples(records, tokenizer, max_seq_length=ROW, packing=False)  # it raises on the longer one
    assert str(refused.value) == (
        f"{path}, line 2: the tokenizer's chat template ({tmp_path / 'base' / 'chat_template.jinja'}) {problem}; fix "
        "the template, or remove it to get the default one."
    )


def test_a_chat_template_that_does_not_parse_is_refused_before_any_record_renders(tmp_path, byte_bpe_tokenizer):
    template, problem = BAD_TEMPLATES["does_not_parse"]
    tokenizer = templated_tokenizer(tmp_path / "base", template, byte_bpe_tokenizer)
    with pytest.raises(UserInputError) as refused:
        ensure_chat_template(tokenizer)
    assert str(refused.value) == (
        f"the tokenizer's chat template ({tmp_path / 'base' / 'chat_template.jinja'}) {problem}; fix the template, "
        "or remove it to get the default one."
    )
