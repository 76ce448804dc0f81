"""Bad input refused in process: a command's torch-free check called as its script calls it, the one line read
from stderr, and the folder it ran in compared before and after (nothing may be written)."""

import hashlib
import sys
from pathlib import Path

import pytest

from hf_tinytx.commands.exits import Ending


# Modules a check must not import: None in sys.modules makes `import torch` fail. A module this process loaded
# earlier still imports, so the script's import log (-X importtime) stays the full proof, on a few cases.
HEAVY = ("torch", "transformers.training_args")


def refused_in_process(capsys, monkeypatch, program: str, check, argv: list[str], heavy=HEAVY,
                       start=None) -> str:
    """The one line `check(argv)` ends with, exit status 2, nothing on stdout: a parser's own
    (`PROGRAM: error: ...`), or the UserInputError the script's ending prints with the same start
    (hf_tinytx/commands/exits.py). A check that ends the process itself (a `main`) passes its SystemExit on.
    `heavy`: the modules it may not import; () for a check that is known to load torch. `start`: what the
    line may begin with (str.startswith's), for a command whose own lines begin otherwise (convert's)."""
    monkeypatch.setattr(sys, "argv", [program])  # argparse names itself after sys.argv[0], as in the script
    capsys.readouterr()
    with monkeypatch.context() as blocked, pytest.raises(SystemExit) as ended:
        for name in heavy:
            blocked.setitem(sys.modules, name, None)
        sys.exit(Ending(f"{program}:").status(lambda: check(argv)))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert ended.value.code == 2 and out == "", err[-3000:]
    start = start or f"{program}: error: "
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith(start), lines
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
