"""The architecture, checked on the source: layers, forbidden imports, no import cycles, one namespace.

    lint-imports   the contracts in pyproject's [tool.importlinter]: imports point down the layers
                   (cli → supervisor → outputs | training → ingest | serving → engine → kernels → contracts →
                   common), ingest imports neither the torch side nor the outputs, the product never imports
                   vlora_va.testing, no cycles between sibling packages
    grimp + Tarjan no cycle among the modules themselves (imports inside functions count)
    an AST scan    no `contracts` / `streams` / `kernels` as a top-level import name, no relative imports,
                   bench/ shares helpers through vlora_va.testing, never through tests/

These checks run on a copy of vlora_va/'s .py files in a temporary folder, in a subprocess whose PYTHONPATH points
there: each check has a negative case, a copy with one offending module added must fail it, and the checkout is
never written to.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.test_packaging import PYPROJECT, ROOT, SOURCE_FOLDERS

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
TIMEOUT_S = 120


def assemble(dest: Path) -> Path:
    """A copy of vlora_va under dest (the .py files only)."""
    for package, source in SOURCE_FOLDERS.items():
        base = ROOT / source
        target = dest.joinpath(*package.split("."))
        for path in base.rglob("*.py"):
            if "__pycache__" not in path.parts:
                out = target / path.relative_to(base)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, out)
    return dest


def add_module(layout: Path, module: str, source: str) -> None:
    """A new module in the assembled copy (never in the checkout)."""
    path = layout.joinpath(*module.split(".")).with_suffix(".py")
    assert not path.exists(), path
    path.write_text(source)


def _env(layout: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    # the copy first: it must win over the editable install of the checkout. Plain, wide output to read.
    env.update(PYTHONPATH=str(layout), NO_COLOR="1", COLUMNS="200")
    return env


def require_import_linter() -> None:
    """Skips where import-linter (and grimp with it) is missing, except under CI (env CI set): a failure there."""
    if not LINT_IMPORTS.exists():
        message = f"{LINT_IMPORTS} is missing: install the test extra (`pip install -e '.[test]'`)"
        unavailable(message)


@pytest.fixture()
def layout(tmp_path) -> Path:
    return assemble(tmp_path / "layout")


# --- import-linter ----------------------------------------------------------------------------------------------

def contracts() -> dict[str, dict]:
    with PYPROJECT.open("rb") as f:
        return {c["id"]: c for c in tomllib.load(f)["tool"]["importlinter"]["contracts"]}


def contract_names() -> dict[str, str]:
    return {contract_id: c["name"] for contract_id, c in contracts().items()}


def test_the_testing_contract_covers_every_layer():
    """A layer added to the layers contract (exhaustive: every new top-level module needs one) must be kept
    off vlora_va.testing too."""
    layers = contracts()["layers"]
    (container,) = layers["containers"]
    modules = {f"{container}.{m.strip()}" for layer in layers["layers"] for m in layer.split("|")}
    assert sorted(contracts()["testing"]["source_modules"]) == sorted(modules)


def lint_imports(layout: Path, *contract_ids: str) -> subprocess.CompletedProcess:
    """lint-imports with pyproject's contracts (all, or the ones named) on the assembled layout."""
    require_import_linter()
    args = [str(LINT_IMPORTS), "--config", str(PYPROJECT), "--no-cache"]
    for contract_id in contract_ids:
        args += ["--contract", contract_id]
    return subprocess.run(args, cwd=layout, env=_env(layout), capture_output=True, text=True, timeout=TIMEOUT_S)


def test_every_contract_is_kept(layout):
    r = lint_imports(layout)
    assert r.returncode == 0, f"lint-imports (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    assert f"Contracts: {len(contract_names())} kept, 0 broken." in r.stdout


def assert_broken(layout: Path, contract_id: str, offending_import: str) -> None:
    r = lint_imports(layout, contract_id)
    assert r.returncode == 1, f"rc {r.returncode}:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    assert f"{contract_names()[contract_id]} BROKEN" in r.stdout, r.stdout[-4000:]
    assert offending_import in r.stdout, f"{offending_import} not reported:\n{r.stdout[-4000:]}"


def test_an_upward_import_breaks_the_layers(layout):
    add_module(layout, "vlora_va.engine.upward", "import vlora_va.serving.daemon\n")
    assert_broken(layout, "layers", "vlora_va.engine.upward -> vlora_va.serving.daemon")


def test_an_import_between_independent_siblings_breaks_the_layers(layout):
    add_module(layout, "vlora_va.outputs.across", "def lazy():\n    import vlora_va.training.spec\n")
    assert_broken(layout, "layers", "vlora_va.outputs.across -> vlora_va.training.spec")


def test_a_new_top_level_module_must_be_given_a_layer(layout):
    add_module(layout, "vlora_va.newcomer", "")
    r = lint_imports(layout, "layers")
    assert r.returncode == 1 and "vlora_va.newcomer" in r.stdout, r.stdout[-4000:]


def test_training_may_import_ingest(layout):
    """Training decodes video the way ingest does: a lower layer, so the layers contract allows it as it is."""
    add_module(layout, "vlora_va.training.decoding", "import vlora_va.ingest.source\n")
    r = lint_imports(layout, "layers")
    assert r.returncode in (0, 1) and contract_names()["layers"] in r.stdout, r.stderr[-2000:]  # it ran
    assert "vlora_va.training.decoding" not in r.stdout, r.stdout[-4000:]


def test_ingest_importing_the_engine_breaks_the_ingest_contract(layout):
    """The layers allow it (engine is below ingest); the forbidden contract does not: no torch on ingest hosts."""
    add_module(layout, "vlora_va.ingest.heavy", "def lazy():\n    from vlora_va.engine import executor\n")
    assert_broken(layout, "ingest", "vlora_va.ingest.heavy -> vlora_va.engine.executor")


def test_the_product_importing_testing_breaks_the_testing_contract(layout):
    add_module(layout, "vlora_va.serving.fixtures", "from vlora_va.testing import tiny\n")
    assert_broken(layout, "testing", "vlora_va.serving.fixtures -> vlora_va.testing.tiny")


def test_a_cycle_between_sibling_packages_breaks_the_acyclic_contract(layout):
    """engine.heads <-> engine.cycled: no module imports itself back, the two packages do."""
    add_module(layout, "vlora_va.engine.heads.cycled_user", "import vlora_va.engine.cycled\n")
    add_module(layout, "vlora_va.engine.cycled", "import vlora_va.engine.heads.base\n")
    assert_broken(layout, "acyclic", "No cycles are allowed in vlora_va.engine.")


# --- module cycles (grimp's graph, Tarjan's strongly connected components) --------------------------------------

# Runs where PYTHONPATH is the assembled layout: the graph of the copy, with the line of every import.
_GRAPH = """
import importlib.util, json, grimp
graph = grimp.build_graph("vlora_va", include_external_packages=False, cache_dir=None)
edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
lines = {f"{a} -> {b}": [d["line_number"] for d in graph.get_import_details(importer=a, imported=b)]
         for a, targets in edges.items() for b in targets}
print(json.dumps({"origin": importlib.util.find_spec("vlora_va").origin, "edges": edges, "lines": lines}))
"""


def import_graph(layout: Path) -> tuple[dict[str, list[str]], dict[str, list[int]]]:
    """The copy's modules -> the modules each imports, and 'a -> b' -> the lines of those imports."""
    require_import_linter()
    r = subprocess.run([sys.executable, "-c", _GRAPH], cwd=layout, env=_env(layout), capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    graph = json.loads(r.stdout)
    assert Path(graph["origin"]).resolve().is_relative_to(layout.resolve()), graph["origin"]  # the copy, not the checkout
    return graph["edges"], graph["lines"]


def strongly_connected_components(edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (a long import chain must not hit the recursion limit). Returns the
    components of more than one module, and single modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:  # every successor done: node closes a component if it is its root
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges.get(node, ()):
                        found.append(sorted(component))
    return found


def describe(component: list[str], lines: dict[str, list[int]]) -> str:
    members = set(component)
    return "\n".join(f"  {edge} (line {', '.join(map(str, lines[edge]))})" for edge in sorted(lines)
                     if edge.split(" -> ")[0] in members and edge.split(" -> ")[1] in members)


def test_the_modules_import_no_cycle(layout):
    edges, lines = import_graph(layout)
    assert "vlora_va.ingest.worker" in edges and "vlora_va.kernels.ops" in edges  # every layer's folder is in
    cycles = strongly_connected_components(edges)
    assert cycles == [], "import cycles:\n" + "\n\n".join(describe(c, lines) for c in cycles)


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(layout):
    add_module(layout, "vlora_va.common.cycle_a", "from vlora_va.common import cycle_b\n")
    add_module(layout, "vlora_va.common.cycle_b", "def later():\n    import vlora_va.common.cycle_a\n")
    edges, _ = import_graph(layout)
    assert ["vlora_va.common.cycle_a", "vlora_va.common.cycle_b"] in strongly_connected_components(edges)


def test_tarjan_on_a_known_graph():
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d"], "f": ["f"], "g": ["a"]}
    assert sorted(strongly_connected_components(edges)) == [["a", "b", "c"], ["d", "e"], ["f"]]


# --- the AST scan: how names are imported ------------------------------------------------------------------------

SCANNED = ("vlora_va", "tests", "bench")
# The repository folders' old top-level names: they are vlora_va.contracts / .ingest / .kernels now
# (and `kernels` is Hugging Face's package on PyPI).
OLD_TOP_LEVEL = {"contracts", "streams", "kernels"}


def imports(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) for every import statement anywhere in the source, function bodies included; a relative
    import's module starts with its dots."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")))
    return sorted(found)


def violations(source: str, banned_top_level: set[str], filename: str = "<source>") -> list[str]:
    """'line N: import X' for each import of a banned top-level name, and for each relative import (the project
    imports absolutely: one spelling per module)."""
    return [f"line {line}: {module}" for line, module in imports(source, filename)
            if module.startswith(".") or module.split(".")[0] in banned_top_level]


def scan(folders: tuple[str, ...], banned_top_level: set[str]) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                name = str(path.relative_to(ROOT))
                found += [f"{name} {v}" for v in violations(path.read_text(), banned_top_level, name)]
    return found


def test_no_file_imports_an_old_top_level_name_or_imports_relatively():
    assert scan(SCANNED, OLD_TOP_LEVEL) == []


def test_benchmarks_share_helpers_through_vlora_va_testing_not_tests():
    assert scan(("bench",), {"tests"}) == []


def test_the_scan_sees_old_names_and_relative_imports_anywhere():
    source = ("import contracts.config\n"
              "from streams import worker\n"
              "def f():\n"
              "    import kernels\n"
              "from . import sibling\n"
              "from vlora_va.kernels import atmm\n"
              "import vlora_va.contracts\n")
    assert violations(source, OLD_TOP_LEVEL) == [
        "line 1: contracts.config", "line 2: streams", "line 4: kernels", "line 5: ."]


def test_the_scan_sees_a_benchmark_importing_tests():
    source = "from tests.conftest import BIKES\nimport vlora_va.testing.tiny\ndef f():\n    import tests\n"
    assert violations(source, {"tests"}) == ["line 1: tests.conftest", "line 4: tests"]
