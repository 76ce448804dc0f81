"""The layout: no import cycle inside training/ or hf_tinytx/ (every import statement, in a
function too, read with `ast`), the module maps true to the files, hf_tinytx by job, the test tree
the product's, `import hf_tinytx` light."""

import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.tiny import REPO_ROOT


PACKAGES = {"hf_tinytx": REPO_ROOT / "hf_tinytx", "hf_tinytx_training": REPO_ROOT / "training"}


def module_names(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted name -> file, for every .py file of the packages."""
    names = {}
    for package, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules that `name` (in `path`) imports; `from m import x`
    counts m, and m.x if a module."""
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


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or through others."""
    seen, stack = set(), list(graph[start])
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack += graph[node]
    return seen


def find_cycles(packages: dict[str, Path]) -> list[list[str]]:
    """Each group of modules that import one another, directly or through others, sorted."""
    known = module_names(packages)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    reach = {name: reachable(graph, name) for name in graph}
    groups = {tuple(sorted(other for other in reach[name] if name in reach[other])) for name in graph
              if name in reach[name]}
    return sorted(map(list, groups))


def test_no_import_cycle_in_the_project():
    cycles = find_cycles(PACKAGES)
    assert not cycles, "import cycles (give what both need a module of its own): " + "; ".join(
        " <-> ".join(group) for group in cycles
    )


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The three shapes the project had: a -> b -> c -> a (one import inside a
    function), and a pair via `from .`."""
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
    """training/__init__.py's docstring names each module by its path, one line each."""
    training = REPO_ROOT / "training"
    text = ast.get_docstring(ast.parse((training / "__init__.py").read_text(encoding="utf-8")))
    listed = set(re.findall(r"^    ([\w/]+\.py) ", text, flags=re.M))
    files = {str(path.relative_to(training)) for path in training.rglob("*.py")
             if path.name not in ("__init__.py", "__main__.py")}
    assert (
        listed == files
    ), f"missing from the map: {sorted(files - listed)}; not files: {sorted(listed - files)}"


def test_no_module_reaches_into_sys_path():
    """A script reads the installed packages; nothing in the product rewrites where Python looks."""
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for package in PACKAGES.values()
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "sys.path" in line
    ]
    assert not found, found


# hf_tinytx by job: the model at the top (remote code copies these files), each other job a sub-package.
HF_TINYTX_TOP = {
    "__init__.py", "auto_registration.py", "configuration_tinytx.py", "modeling_tinytx.py", "corpus.py",
    "probes.py", "tokenization.py",
}
HF_TINYTX_ROOMS = {"commands", "convert", "folders", "interpret", "serve"}


def test_hf_tinytx_keeps_the_model_at_the_top_and_each_job_in_a_room():
    library = REPO_ROOT / "hf_tinytx"
    top = {path.name for path in library.glob("*.py")}
    rooms = {path.name for path in library.iterdir() if (path / "__init__.py").is_file()}
    assert (top, rooms) == (HF_TINYTX_TOP, HF_TINYTX_ROOMS)


def test_each_room_of_hf_tinytx_names_its_modules():
    """Each sub-package's docstring names every module in it: the map a reader starts from."""
    for room in HF_TINYTX_ROOMS:
        folder = REPO_ROOT / "hf_tinytx" / room
        text = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        unnamed = [
            path.name for path in folder.glob("*.py") if path.name != "__init__.py" and path.stem not in text
        ]
        assert not unnamed, f"hf_tinytx/{room}/__init__.py does not name {unnamed}"


def test_the_test_tree_has_the_products_folders():
    """tests/hf_tinytx/X tests hf_tinytx/X, tests/training/X tests training/X;
    tests/benchmarks tests benchmarks/."""
    tests = REPO_ROOT / "tests"
    own = {"helpers", "kill_campaign"}  # the tests' own tools, not a product folder
    for folder in tests.rglob("__init__.py"):
        relative = folder.parent.relative_to(tests)
        if relative.parts and relative.parts[0] not in own:
            assert (REPO_ROOT / relative).is_dir(), f"tests/{relative} mirrors no product folder {relative}/"
    assert not [
        path.name
        for path in tests.glob("*/")
        if path.is_dir() and not (path / "__init__.py").exists() and path.name != "__pycache__"
    ]


def test_importing_hf_tinytx_loads_neither_torch_nor_transformers():
    """The commands' checks import hf_tinytx's torch-free modules before torch loads; the classes load on
    first touch, and "tinytx" is registered with the Auto classes when transformers loads them."""
    code = (
        "import sys, hf_tinytx, hf_tinytx.folders.safe, hf_tinytx.folders.location, "
        "hf_tinytx.folders.weights, hf_tinytx.commands.flags, hf_tinytx.commands.signals\nassert 'torch' "
        "not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)\nfrom transformers "
        "import AutoConfig\nassert type(AutoConfig.for_model('tinytx')).__name__ == 'TinyTxConfig'\nassert "
        "hf_tinytx.TinyTxForCausalLM.__module__ == 'hf_tinytx.modeling_tinytx'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_config_saved_before_any_auto_class_loads_still_carries_its_code(tmp_path):
    """The registration also runs when our config class loads first: a config saved alone gets `auto_map` and
    configuration_tinytx.py beside it."""
    code = (
        "import os, sys\nfrom hf_tinytx import TinyTxConfig\nassert "
        "'transformers.models.auto.modeling_auto' not in sys.modules\nconfig = TinyTxConfig(hidden_size=32, "
        "num_hidden_layers=1, num_attention_heads=2, "
        "intermediate_size=64)\nconfig.save_pretrained(sys.argv[1])\nassert 'configuration_tinytx.py' in "
        "os.listdir(sys.argv[1]), os.listdir(sys.argv[1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "config")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
