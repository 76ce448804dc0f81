"""Fine-tuning data: checked records (sft/records.py) in, token ids with labels out: every token of a text
record, the response of a prompt/response record, the assistant turns of a chat (labels -100 elsewhere).
Examples are padded one per row or packed end to end; what that cuts or drops is counted (`RowCounts`)."""

import copy
import os
from dataclasses import dataclass

import jinja2
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq
from transformers.utils.chat_template_utils import _compile_jinja_template

from hf_tinytx.tokenization import adds_bos
from hf_tinytx_training.errors import UserInputError


IGNORE_INDEX = -100  # the label value transformers' cross-entropy skips

# Used only when the data is chat and the tokenizer has no template. Role markers are plain
# text (no new tokens, so the vocabulary and the embedding table stay as they are); the EOS
# after each turn is what stops generation.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def ensure_chat_template(tokenizer) -> bool:
    """Gives the tokenizer the default chat template if it has none (returns whether
    it did); refuses a broken one."""
    if tokenizer.chat_template:
        try:
            # transformers' own (cached) compile: a syntax error or an unknown filter shows here.
            _compile_jinja_template(tokenizer.get_chat_template())
        except jinja2.TemplateError as error:
            raise UserInputError(_template_failure(error, tokenizer)) from None
        return False
    if tokenizer.eos_token is None:
        raise UserInputError(
            "Chat data needs a tokenizer with an EOS token (it ends each turn); this one has none."
        )
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return True


def tokenize_record(record: dict, tokenizer) -> dict:
    """{"input_ids", "labels"}: labels equal input_ids on the tokens to learn and -100 elsewhere."""
    try:
        segments = _segments(record, tokenizer)  # (text, learn?) pieces in order
    except jinja2.TemplateError as error:
        raise UserInputError(_template_failure(error, tokenizer, record.get("where"))) from None
    input_ids, labels = [], []
    for text, learn in segments:
        # Each piece on its own, so a token never straddles the prompt/response boundary.
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] if isinstance(text, str) else text
        input_ids += ids
        labels += ids if learn else [IGNORE_INDEX] * len(ids)
    return {"input_ids": input_ids, "labels": labels}


def _segments(record: dict, tokenizer) -> list[tuple]:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if record["kind"] == "text":
        return [(_bos(tokenizer), False), (record["text"], True), (eos, True)]
    if record["kind"] == "prompt":
        return [(_bos(tokenizer), False), (record["prompt"], False), (record["response"], True), (eos, True)]
    return _chat_segments(record["messages"], tokenizer)


def _bos(tokenizer) -> list[int]:
    """BOS only where the tokenizer itself adds it (Llama-style), so training sees what inference will see."""
    return [tokenizer.bos_token_id] if adds_bos(tokenizer) else []


def _chat_segments(messages: list[dict], tokenizer) -> list[tuple]:
    """Splits the rendered conversation at each assistant turn: turn i is the text between
    `template(messages[:i], add_generation_prompt=True)` and `template(messages[:i + 1])` (for a
    template that concatenates its turns)."""
    full = _render(tokenizer, messages, add_generation_prompt=False)
    segments, done = [], 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], add_generation_prompt=True)
        upto_reply = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        start, end = len(prompt), len(upto_reply)
        if not (done <= start <= end and upto_reply.startswith(prompt) and full.startswith(upto_reply)):
            raise UserInputError(
                "The tokenizer's chat template does not render a conversation as the concatenation of its "
                "turns, so the assistant replies cannot be located for the loss; use a template that does "
                "(or remove the tokenizer's chat_template to get the default one)."
            )
        segments += [(full[done:start], False), (full[start:end], True)]
        done = end
    segments.append((full[done:], False))
    return [(text, learn) for text, learn in segments if text]


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _template_failure(error: jinja2.TemplateError, tokenizer, where: str | None = None) -> str:
    """One line for a chat template that does not parse, or that raises on the
    conversation of record `where`."""
    where = f"{where}: " if where else ""
    if isinstance(error, jinja2.TemplateSyntaxError):
        problem = f"does not parse ({error.message}, template line {error.lineno})"
    else:
        problem = f"failed on this conversation ({type(error).__name__}: {error})"
    return (
        f"{where}the tokenizer's chat template ({_template_source(tokenizer)}) {problem}; fix the template, "
        "or remove it to get the default one."
    )


def _template_source(tokenizer) -> str:
    """The file the template was read from: chat_template.jinja (transformers 5) or tokenizer_config.json."""
    folder = tokenizer.name_or_path
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if folder and os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return f"the chat_template of tokenizer {folder!r}"


@dataclass
class RowCounts:
    """How the records became rows: what was cut off or dropped, for the console and the model card."""

    records: int
    rows: int
    tokens: int  # in all records, whole
    kept_tokens: int  # in the rows trained on
    longest: int  # tokens of the longest record
    cut: int  # one record a row: records longer than max_seq_length (their ends are cut off)
    # one record a row: cut records left with nothing to learn; packed: rows of prompt tokens only
    dropped: int
    empty: int  # one record a row: records with no token to learn even whole (e.g. an empty reply and no EOS)

    def summary(self, path: str, max_seq_length: int, packing: bool) -> str | None:
        """One line for the console; None when padding kept every record whole."""
        if packing:
            dropped = (
                f"{self.dropped:,} rows holding only prompt tokens ({self.tokens - self.kept_tokens:,} "
                "tokens) were dropped"
                if self.dropped
                else "no token was dropped"
            )
            return (
                f"{path}: packed {self.records:,} records ({self.tokens:,} tokens) into {self.rows:,} rows "
                f"of at most {max_seq_length} tokens; {dropped}."
            )
        if not (self.cut or self.empty):
            return None
        empty = f"; {self.empty:,} hold no token to learn and were dropped" if self.empty else ""
        return (
            f"{path}: {self.cut:,} of {self.records:,} records were cut to --max_seq_length {max_seq_length} "
            f"tokens (the longest has {self.longest:,}); {self.dropped:,} of them dropped because the prompt "
            f"fills the row{empty}; raise --max_seq_length (up to the model's context) or shorten those "
            "records to train on all of them."
        )


class RowsDataset(Dataset):
    """Training rows as Trainer takes them, with their `counts`."""

    counts: RowCounts


def build_examples(records: list[dict], tokenizer, max_seq_length: int, packing: bool) -> RowsDataset:
    """Tokenized rows for `pad_collator`, each at most `max_seq_length` tokens,
    each with something to learn."""
    tokenized = [tokenize_record(record, tokenizer) for record in records]
    if packing:
        # End to end, then cut: no padding is wasted; documents may attend to the
        # one before them in the same row.
        ids = [token for example in tokenized for token in example["input_ids"]]
        labels = [label for example in tokenized for label in example["labels"]]
        rows = [{"input_ids": ids[i : i + max_seq_length], "labels": labels[i : i + max_seq_length]}
                for i in range(0, len(ids), max_seq_length)]
    else:
        rows = [{key: values[:max_seq_length] for key, values in example.items()} for example in tokenized]
    # A row whose learnable tokens were all cut off (a prompt longer than
    # max_seq_length) would only add zero loss.
    kept = [row for row in rows if _learns(row)]
    lengths = [len(example["input_ids"]) for example in tokenized]
    empty = 0 if packing else sum(not _learns(example) for example in tokenized)
    dataset = RowsDataset.from_list(kept)
    dataset.counts = RowCounts(
        records=len(records), rows=len(kept), tokens=sum(lengths),
        kept_tokens=sum(len(row["input_ids"]) for row in kept), longest=max(lengths, default=0),
        cut=0 if packing else sum(length > max_seq_length for length in lengths),
        dropped=len(rows) - len(kept) - empty, empty=empty,
    )
    return dataset


def _learns(row: dict) -> bool:
    """Whether a row predicts a token to learn (the first position is never
    predicted: nothing comes before it)."""
    return any(label != IGNORE_INDEX for label in row["labels"][1:])


def pad_collator(tokenizer) -> DataCollatorForSeq2Seq:
    """Pads a batch on the right: input_ids with the pad id, labels with -100,
    attention_mask 0 on the padding."""
    if tokenizer.padding_side != "right":
        # A copy: the saved tokenizer keeps the side its owner chose for batched generation.
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.padding_side = "right"
    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
