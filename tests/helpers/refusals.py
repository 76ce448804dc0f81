"""Bad input refused in process: a command's torch-free check called as its script calls it, the one line read
from stderr, and the folder it ran in compared before and after (nothing may be written)."""

import hashlib
import sys
from pathlib import Path

import pytest

from hf_tinytx.commands.exits import Ending


def refused_in_process(capsys, monkeypatch, program: str, check, argv: list[str]) -> str:
    """The one line `check(argv)` ends with, exit status 2: a parser's own (`PROGRAM: error: ...`), or the
    UserInputError the script's ending prints with the same start (hf_tinytx/commands/exits.py)."""
    monkeypatch.setattr(sys, "argv", [program])  # argparse names itself after sys.argv[0], as in the script
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        sys.exit(Ending(f"{program}:").status(lambda: check(argv)))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert ended.value.code == 2, err[-3000:]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith(f"{program}: error: "), lines
    return lines[0]


def snapshot(folder: Path) -> dict:
    """Every entry under `folder` (links as links): name -> a file's hash, a link's target, or "folder"."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = f"-> {path.readlink()}"
        elif path.is_file():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[name] = "folder"
    return found
