"""The folder-level import graph of scone_jax/ is a DAG and keeps the rules of the house
(../shared/ARCHITECTURE.md, DEVELOPERS.md). Every import counts, those inside functions too:
hiding one there moves a cycle out of Python's sight, not out of the design."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scone_jax"

# part -> parts it must never import
FORBIDDEN = {
    "model": {"data", "train", "fgrams", "forest", "cli"},
    "fgrams": {"model", "train"},
    "data": {"fgrams", "forest", "model", "train"},
    "forest": {"model", "train", "data", "fgrams"},
    "export": {"train"},
    "serve": {"train"},
    "artifacts": {"train"},
    "train": {"serve"},
}
LEAVES = {"sharding", "runtime"}  # may import only scone_jax.errors
LEAF_ALLOWED = {"errors"}


def part_of(module: str) -> str | None:
    """`scone_jax.train.loop` -> `train`; `scone_jax.errors` -> `errors`."""
    names = module.split(".")
    return names[1] if names[0] == "scone_jax" and len(names) > 1 else None


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = path.relative_to(package.parent).with_suffix("").parts[: -node.level]
                module = ".".join(base + ((node.module,) if node.module else ()))
            else:
                module = node.module or ""
            names = (
                [f"{module}.{alias.name}" for alias in node.names]
                if module == "scone_jax"
                else [module]
            )
            out += [(name, node.lineno) for name in names]
    return out


def import_edges(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> the import lines ("path:line imports module")."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        src = part_of(".".join(path.relative_to(package.parent).with_suffix("").parts))
        for module, line in imports(path, package):
            dst = part_of(module)
            if src and dst and src != dst:
                where = f"{path.relative_to(package.parent)}:{line} imports {module}"
                edges.setdefault((src, dst), []).append(where)
    return edges


def find_cycle(edges) -> list[str] | None:
    """One cycle of parts (first part repeated at the end), or None for a DAG."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def broken_rules(edges) -> list[str]:
    out = []
    for (src, dst), where in sorted(edges.items()):
        if (
            dst == "cli"
            or dst in FORBIDDEN.get(src, ())
            or (src in LEAVES and dst not in LEAF_ALLOWED)
        ):
            out += [f"{w} ({src} must not import {dst})" for w in where]
    return out


def test_folder_import_graph_is_a_dag():
    edges = import_edges()
    cycle = find_cycle(edges)
    assert cycle is None, (
        "import cycle "
        + " -> ".join(cycle)
        + ":\n"
        + "\n".join(edges[(a, b)][0] for a, b in zip(cycle, cycle[1:]))
    )


def test_imports_keep_the_rules_of_the_house():
    edges = import_edges()
    assert ("train", "model") in edges and ("serve", "model") in edges  # the scan sees the package
    broken = broken_rules(edges)
    assert not broken, "imports against the architecture:\n" + "\n".join(broken)


def test_the_checks_find_a_cycle_and_a_broken_rule_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "scone_jax"
    for part, body in {
        "model": "from scone_jax.errors import UserError\n",
        "train": "from scone_jax.model import layers\n",
        "serve": "def f():\n    from scone_jax.train import loop\n",
        "export": "import scone_jax.serve.engine\n",
    }.items():
        (pkg / part).mkdir(parents=True)
        (pkg / part / "__init__.py").write_text("")
        (pkg / part / "a.py").write_text(body)
    (pkg / "train" / "b.py").write_text("def g():\n    from ..export import x\n")
    edges = import_edges(pkg)
    assert find_cycle(edges) == ["export", "serve", "train", "export"]
    assert broken_rules(edges) == [
        "scone_jax/serve/a.py:2 imports scone_jax.train (serve must not import train)"
    ]
