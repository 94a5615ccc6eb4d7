"""The package's shape: imports run one way, no private name crosses a module, functions fit a
screen and modules (Python, JavaScript, CSS) stay under MAX_MODULE_LINES.

Every `import` in `src/attnlab` is read with `ast`, lazy ones inside functions too (only
`if TYPE_CHECKING:` blocks are left out: they never run). `LAYERS` is the one place the order
is written; the README's Layout table follows it.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"

# Lowest first: a module may import its own layer or a lower one, never a higher one.
LAYERS = (
    "model",  # config, layers, attention, kv_cache, decode, the GPT, the trace seam, runtime
    "tokenizers",  # every tokenizer, a Hugging Face tokenizer directory, chat templates
    "viz",  # figures of plain tensors
    "checkpoint",  # attnlab's own checkpoint directories
    "hf",  # Hugging Face families, config fields, weight files
    "load",  # open any model directory: attnlab checkpoint or Hugging Face
    "interp",  # edits, head detectors, patching, logit lens
    "generate",  # decoding loop
    "train",  # loop, data, recipes, time budget, distributed
    "viewer",  # the HTTP app, its payloads, the notebook view, web/
    "demos",  # the seed reproductions
    "cli",  # the `attnlab` command
    "__init__",  # the public API
    "__main__",
)
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: `if TYPE_CHECKING:` bodies are skipped (their else kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports(root: Path) -> dict[str, set[tuple[str, str | None]]]:
    """module -> {(imported module, name imported from it or None)} for names under root."""
    top = root.name
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    found: dict[str, set[tuple[str, str | None]]] = {}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges: set[tuple[str, str | None]] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {(a.name, None) for a in node.names if a.name.split(".")[0] == top}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = (".".join(base + ([node.module] if node.module else [])) if node.level
                          else node.module or "")
                if target.split(".")[0] != top:
                    continue
                for alias in node.names:  # `from pkg import module` imports the module
                    sub = f"{target}.{alias.name}"
                    edges.add((sub, None) if sub in paths else (target, alias.name))
        found[mod] = edges
    return found


def layer_of(module: str) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    if name not in LAYERS:
        raise AssertionError(f"{module}: package {name!r} is in no layer; add it to LAYERS")
    return LAYERS.index(name)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def problems(root: Path) -> list[str]:
    """Cycles, upward imports, private names taken from another module, a package's own
    modules importing its __init__: one line each, sorted."""
    found = imports(root)
    out = []
    graph = {mod: {target for target, _ in edges if target in found} for mod, edges in
             found.items()}
    if cycle := _cycle(graph):
        out.append("import cycle: " + " -> ".join(cycle))
    for mod, edges in sorted(found.items()):
        for target, name in sorted(edges, key=str):
            if name and name.startswith("_") and not name.startswith("__"):
                out.append(f"{mod} imports the private name {name} from {target}")
            if target == root.name and name and name.startswith("__"):
                continue  # the root's dunders (__version__): Python imports the root first
            if target in found and layer_of(target) > layer_of(mod):
                out.append(f"{mod} imports {target}, a higher layer")
            if mod != target and mod.startswith(target + ".") and target != root.name:
                out.append(f"{mod} imports its own package's __init__ ({target})")
    return sorted(set(out))


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {lines}")
    return out


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """Source files (Python, and the viewer's JavaScript and CSS) longer than `limit`."""
    out = []
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".js", ".css"):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                out.append(f"{path.relative_to(root)}: {lines}")
    return out


def test_imports_run_one_way_with_no_cycle_and_no_private_name() -> None:
    assert problems(SRC) == []


def test_no_function_is_longer_than_a_screen() -> None:
    assert long_functions(SRC) == []


def test_no_module_is_longer_than_a_sitting() -> None:
    assert long_modules(SRC) == []


def test_the_package_root_holds_at_most_fourteen_entries() -> None:
    entries = [p.name for p in SRC.iterdir() if p.name not in ("__pycache__", "py.typed")]
    assert len(entries) <= 14, sorted(entries)


def test_every_package_has_a_layer() -> None:
    for path in SRC.iterdir():
        if path.suffix == ".py" or (path / "__init__.py").exists():
            layer_of(f"attnlab.{path.stem}")


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    root = tmp_path / "attnlab"
    shutil.copytree(SRC, root, ignore=shutil.ignore_patterns("__pycache__", "web"))
    return root


def _plant(root: Path, module: str, line: str) -> None:
    path = root / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _planted():\n    {line}\n",
                    encoding="utf-8")


def test_a_planted_lazy_cycle_is_found(copy: Path) -> None:
    _plant(copy, "model/attention.py", "from .gpt import GPT")
    assert any(p.startswith("import cycle:") and "attnlab.model.attention" in p
               for p in problems(copy)), problems(copy)


def test_a_planted_upward_import_is_found(copy: Path) -> None:
    _plant(copy, "checkpoint.py", "from .hf import load_hf")
    assert "attnlab.checkpoint imports attnlab.hf, a higher layer" in problems(copy)


def test_a_planted_private_import_is_found(copy: Path) -> None:
    _plant(copy, "viz/figures.py", "from .core import _tick_positions")
    assert ("attnlab.viz.figures imports the private name _tick_positions from "
            "attnlab.viz.core") in problems(copy)


def test_an_import_under_type_checking_is_not_a_cycle(copy: Path) -> None:
    path = copy / "model" / "attention.py"
    path.write_text(path.read_text(encoding="utf-8") +
                    "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from .gpt import GPT\n", encoding="utf-8")
    assert problems(copy) == problems(SRC)


def test_a_planted_long_function_is_found(copy: Path) -> None:
    body = "\n".join("    x = 1" for _ in range(MAX_FUNCTION_LINES))
    (copy / "model" / "planted.py").write_text(f"def long():\n{body}\n", encoding="utf-8")
    assert f"model/planted.py:1 long: {MAX_FUNCTION_LINES + 1}" in long_functions(copy)


def test_a_planted_long_module_is_found(copy: Path) -> None:
    lines = "\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES + 1))
    (copy / "model" / "planted.py").write_text(lines + "\n", encoding="utf-8")
    assert f"model/planted.py: {MAX_MODULE_LINES + 1}" in long_modules(copy)
