"""Trainer's flags for finetune.py's --help, read from transformers' source: importing `TrainingArguments` imports
torch (seconds). `ast` reads its fields (literal defaults and help texts) into a dataclass that HfArgumentParser lists
as it lists the real class; only a default computed at import time (the optimizer's) goes unshown.
"""

import argparse
import ast
import builtins
import dataclasses
import enum
import typing
from importlib.util import find_spec
from pathlib import Path

from transformers.utils import logging


SOURCES = ("training_args", "trainer_utils", "debug_utils")  # TrainingArguments and the enums its annotations name


def training_arguments_for_help() -> type:
    """A dataclass with TrainingArguments' fields as declared; the real class where the source reads otherwise."""
    try:
        return _from_source()
    except Exception:  # another transformers' layout: the same help, after torch loads
        from transformers import TrainingArguments

        return TrainingArguments


class _Names(dict):
    """What the declarations name: the enums read, builtins, and `str` for any other class (the help shows no type)."""

    def __missing__(self, name: str):
        return getattr(builtins, name, str)


def _from_source() -> type:
    folder = Path(find_spec("transformers").origin).parent
    trees = [ast.parse((folder / f"{name}.py").read_text(encoding="utf-8")) for name in SOURCES]
    classes = {node.name: node for tree in trees for node in tree.body if isinstance(node, ast.ClassDef)}
    names = _Names(Any=typing.Any, Literal=typing.Literal,
                   trainer_log_levels=dict(logging.get_log_levels_dict(), passive=-1))
    for name, node in classes.items():
        if [ast.unparse(base) for base in node.bases] == ["ExplicitEnum"]:
            values = {item.targets[0].id: item.value.value for item in node.body
                      if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)}
            names[name] = enum.Enum(name, values, type=str)
    fields = [_field(node, names) for node in classes["TrainingArguments"].body if isinstance(node, ast.AnnAssign)]
    return dataclasses.make_dataclass("TrainingArguments", fields)


def _field(node: ast.AnnAssign, names: _Names) -> tuple:
    """(name, type, field) of `name: type = field(...)`; the expressions are those transformers' import would run."""
    keywords = {keyword.arg: keyword.value for keyword in node.value.keywords}
    spec = {key: eval(ast.unparse(value), {}, names) for key, value in keywords.items() if key != "default"}
    if "default" in keywords:
        try:
            spec["default"] = ast.literal_eval(keywords["default"])
        except ValueError:  # computed as transformers imports, from torch's version: not shown
            spec["default"] = argparse.SUPPRESS
    return node.target.id, eval(ast.unparse(node.annotation), {}, names), dataclasses.field(**spec)
