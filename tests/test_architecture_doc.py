"""ARCHITECTURE.md checked against the tree it describes, so the doc cannot drift from the code unnoticed.

    module map    every product module (each .py under vlora_va/ but __init__.py) is named in
                  the map, and every file or folder the map names exists
    plug-in table every registry of vlora_va/contracts/plugins.py has a row, and the row's built-ins are exactly
                  the names the registry ships with

The map is read the way a person reads it: a folder line (`vlora_va/cluster/`, `vlora_va/ingest/  (...)`) sets the
folder, the indented lines under it name files relative to it (`placement.py`, `sinks/base.py`, several on one
line as `cards.py, draw.py`, a glob as `tables/*.json`); vlora_va/testing/ is described in one sentence at the
end of the map, whose `name.py` words are its files. The tree is read afresh on each run: files are renamed
while the doc is edited. Each check has a negative case: the doc with a line taken out, or a name made up, fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.test_packaging import ROOT

DOC = ROOT / "ARCHITECTURE.md"
PRODUCT_FOLDERS = ("vlora_va",)
TESTING = "vlora_va/testing/"
# A map line's path column: names separated by ", " (the description follows after two or more spaces).
PATH_FIELD = re.compile(r"^[\w.*/-]+(?:, [\w.*/-]+)*$")
FIELD = re.compile(r"\S+(?: \S+)*")  # runs of text separated by two or more spaces


def section(text: str, title: str) -> str:
    """The text under `## title`, up to the next `## ` heading."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def map_lines(text: str) -> list[str]:
    """The lines of the module map's code block."""
    return section(text, "Module map").split("```")[1].splitlines()


def path_field(line: str) -> list[str]:
    """The names in a map line's path column ([] for rules, layer labels only, continued descriptions)."""
    for field in FIELD.findall(line):
        if PATH_FIELD.match(field) and ("." in field or "/" in field):
            return field.split(", ")
    return []


def named_paths(text: str) -> set[str]:
    """Every repository path the module map names: files, folders (ending in /) and globs."""
    lines = map_lines(text)
    testing = next(i for i, line in enumerate(lines) if TESTING in line)
    named, folder = set(), ""
    for line in lines[:testing]:
        for name in path_field(line):
            if name.split("/")[0] in PRODUCT_FOLDERS:  # a path from the root: a folder line or a top-level file
                folder = name if name.endswith("/") else folder
                named.add(name)
            else:
                named.add(folder + name)
    # the testing helpers sit outside the layers, named in one sentence
    named.update(TESTING + name for name in re.findall(r"\b\w+\.py\b", "\n".join(lines[testing:])))
    return named


def product_modules() -> set[str]:
    """Every product .py file but the package __init__.py files, as repository paths."""
    found = set()
    for folder in PRODUCT_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts and path.name != "__init__.py":
                found.add(path.relative_to(ROOT).as_posix())
    return found


def exists(name: str) -> bool:
    return any(ROOT.glob(name)) if "*" in name else (ROOT / name).exists()


def map_problems(text: str) -> list[str]:
    """What the module map gets wrong: product modules it does not name, names that are not in the tree."""
    named = named_paths(text)
    missing = sorted(product_modules() - named)
    stale = sorted(name for name in named if not exists(name))
    problems = [f"not in ARCHITECTURE.md's module map: {path}" for path in missing]
    return problems + [f"named in ARCHITECTURE.md's module map but not in the tree: {name}" for name in stale]


def without_line(text: str, needle: str) -> str:
    """The doc with the module map's one line containing `needle` taken out."""
    lines = map_lines(text)
    hits = [line for line in lines if needle in line]
    assert len(hits) == 1, hits
    return text.replace(hits[0] + "\n", "", 1)


def test_the_module_map_names_every_product_module_and_nothing_that_is_gone():
    problems = map_problems(DOC.read_text())
    assert not problems, "\n".join(problems)


def test_a_module_left_out_of_the_map_or_a_name_that_is_gone_is_reported():
    text = DOC.read_text()
    assert "not in ARCHITECTURE.md's module map: vlora_va/kernels/segments.py" in map_problems(
        without_line(text, "segments.py  "))
    assert "not in ARCHITECTURE.md's module map: vlora_va/cluster/loads.py" in map_problems(
        without_line(text, "loads.py  "))
    # one of two names on a line, and a testing helper named only in the closing sentence
    assert "not in ARCHITECTURE.md's module map: vlora_va/training/draw.py" in map_problems(
        text.replace("cards.py, draw.py ", "cards.py         ", 1))
    assert "not in ARCHITECTURE.md's module map: vlora_va/testing/tiny.py" in map_problems(
        text.replace("(tiny.py, ", "(", 1))
    made_up = text.replace("                   segments.py  ", "                   gone.py, segments.py  ", 1)
    assert ("named in ARCHITECTURE.md's module map but not in the tree: vlora_va/kernels/gone.py"
            in map_problems(made_up))


# --- the plug-in table ------------------------------------------------------------------------------------------

def shipped_registries() -> dict[str, list[str]]:
    """Each registry of contracts/plugins.py with the names it ships with, read in a fresh interpreter (tests in
    this process register plug-ins of their own)."""
    code = ("import json; from vlora_va.contracts import plugins as p; "
            "print(json.dumps({n: list(r.names()) for n, r in vars(p).items() if isinstance(r, p.Registry)}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return json.loads(out)


def table_rows(text: str) -> dict[str, list[str]]:
    """The plug-in table: registry name -> the backticked names of its built-ins column."""
    rows = {}
    for line in section(text, "Plug-in points").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            # the built-ins column: its backticked names, without what a parenthesis adds (a file, a device)
            rows[cells[0].strip("`")] = re.findall(r"`([^`]+)`", re.sub(r"\(.*?\)", "", cells[-1]))
    return rows


def table_problems(text: str, registries: dict[str, list[str]]) -> list[str]:
    rows = table_rows(text)
    problems = [f"registry {name} has no row in ARCHITECTURE.md's plug-in table" for name in registries
                if name not in rows]
    for name, builtins in registries.items():
        if name in rows and sorted(rows[name]) != sorted(builtins):
            problems.append(f"{name}: the plug-in table lists {rows[name]}, the registry ships {builtins}")
    return problems


def test_the_plug_in_table_lists_every_registry_with_its_built_ins():
    problems = table_problems(DOC.read_text(), shipped_registries())
    assert not problems, "\n".join(problems)


def test_a_built_in_or_a_registry_missing_from_the_table_is_reported():
    text, registries = DOC.read_text(), shipped_registries()
    row = next(line for line in text.splitlines() if line.startswith("| `ATMM_BACKENDS`"))
    assert any(p.startswith("ATMM_BACKENDS: the plug-in table lists")
               for p in table_problems(text.replace(row, row.replace(", `triton`", "")), registries))
    assert ("registry ATMM_BACKENDS has no row in ARCHITECTURE.md's plug-in table"
            in table_problems(text.replace(row + "\n", ""), registries))
