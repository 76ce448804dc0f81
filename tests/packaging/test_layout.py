"""The layout: no import cycle inside training/ (installed as hf_tinytx_training) or hf_tinytx/, the module map of
training/__init__.py true to the files, and `import hf_tinytx` light.

Cycles: every import statement, at module level or inside a function, read with `ast` and resolved to the project's
own modules. A cycle means two modules that cannot be understood, tested or imported one without the other; the fix
is a third module both import."""

import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.tiny import REPO_ROOT


PACKAGES = {"hf_tinytx": REPO_ROOT / "hf_tinytx", "hf_tinytx_training": REPO_ROOT / "training"}


def module_names(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted name -> file, for every .py file of the packages (a package's own name for its __init__.py)."""
    names = {}
    for package, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules that `name` (in `path`) imports, relative imports resolved; `from m import x` counts m,
    and m.x as well where x is a module of its own."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def find_cycles(packages: dict[str, Path]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (or a module importing itself), sorted."""
    known = module_names(packages)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):  # Tarjan's algorithm; the graph is a few dozen modules, so recursion depth is no concern
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def test_no_import_cycle_in_the_project():
    cycles = find_cycles(PACKAGES)
    assert not cycles, "import cycles (give what both need a module of its own): " + "; ".join(
        " <-> ".join(group) for group in cycles
    )


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The three shapes the project had: a -> b -> c -> a (one import inside a function), and a pair via `from .`."""
    package = tmp_path / "pkg"
    package.mkdir()
    files = {
        "__init__.py": "",
        "a.py": "from .b import thing\n",
        "b.py": "import pkg.c\n",
        "c.py": "def late():\n    from pkg.a import thing\n",
        "d.py": "from . import e\n",
        "e.py": "from .d import other\n",
        "f.py": "from .a import thing\n",  # imports into a cycle without being part of it
    }
    for name, text in files.items():
        (package / name).write_text(text)
    assert find_cycles({"pkg": package}) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]


def test_the_module_map_of_training_lists_every_module_and_no_other():
    """training/__init__.py's docstring names each module by its path (one line each): a module added, moved or
    removed must be said there."""
    training = REPO_ROOT / "training"
    text = ast.get_docstring(ast.parse((training / "__init__.py").read_text(encoding="utf-8")))
    listed = set(re.findall(r"^    ([\w/]+\.py) ", text, flags=re.M))
    files = {str(path.relative_to(training)) for path in training.rglob("*.py")
             if path.name not in ("__init__.py", "__main__.py")}
    assert listed == files, f"missing from the map: {sorted(files - listed)}; not files: {sorted(listed - files)}"


def test_importing_hf_tinytx_loads_neither_torch_nor_transformers():
    """The commands' checks import hf_tinytx's torch-free modules before torch loads (seconds); the classes load on
    first touch, and "tinytx" is registered with the Auto classes when transformers loads them."""
    code = ("import sys, hf_tinytx, hf_tinytx.folders, hf_tinytx.sources, hf_tinytx.stored_weights, "
            "hf_tinytx.command_flags\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)\n"
            "from transformers import AutoConfig\n"
            "assert type(AutoConfig.for_model('tinytx')).__name__ == 'TinyTxConfig'\n"
            "assert hf_tinytx.TinyTxForCausalLM.__module__ == 'hf_tinytx.modeling_tinytx'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_config_saved_before_any_auto_class_loads_still_carries_its_code(tmp_path):
    """The registration also runs when our config class loads first: a config saved alone gets `auto_map` and
    configuration_tinytx.py beside it, as with the package's former eager registration."""
    code = ("import os, sys\nfrom hf_tinytx import TinyTxConfig\n"
            "assert 'transformers.models.auto.modeling_auto' not in sys.modules\n"
            "config = TinyTxConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)\n"
            "config.save_pretrained(sys.argv[1])\n"
            "assert 'configuration_tinytx.py' in os.listdir(sys.argv[1]), os.listdir(sys.argv[1])\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "config")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
