"""No folder or module at the repository root shadows an installed distribution.

Python puts the directory it starts in first on sys.path (`python -c`, `python -m`, a notebook), and pytest puts the
repository root there too (tests/ is a package). A folder at the root with an `__init__.py` is then imported in place
of any installed distribution of the same top-level name. That broke the suite on 2026-12-07: the project's own
`kernels/` hid Hugging Face's `kernels`, which transformers 5.25 imports to load any model (28 collection errors).

The check asks Python itself, in a fresh interpreter started in the folder under test, where each top-level name of
every installed distribution (`importlib.metadata.packages_distributions()`) would be imported from. A name found
under that folder is shadowed, unless the folder is that distribution's own source (vlora_va, installed editable).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.test_packaging import DISTRIBUTION, ROOT

TIMEOUT_S = 120

# Run with the folder under test as the working directory: sys.path[0] is '' there, as for `python -c` at the root.
_PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, re, sys
here = os.path.realpath(os.getcwd())
def at_top(path):  # the folder's own entry, not something deeper (a virtualenv inside it holds site-packages)
    return path is not None and os.path.dirname(os.path.realpath(path).rstrip(os.sep)) in (here,)
found = {}
for name, dists in md.packages_distributions().items():
    owners = sorted({re.sub(r"[-_.]+", "-", d).lower() for d in dists})
    if not name.isidentifier():
        continue
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        continue
    if spec is None:
        continue
    places = list(spec.submodule_search_locations or []) or [spec.origin]
    if any(at_top(p) for p in places):
        found[name] = owners
print(json.dumps(found))
"""


def names_from(folder: Path) -> dict[str, list[str]]:
    """{top-level name: its distributions} for every installed distribution's name that Python, started in
    `folder`, would import from inside `folder`."""
    r = subprocess.run([sys.executable, "-c", _PROBE], cwd=folder, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def shadowed(folder: Path) -> dict[str, list[str]]:
    """The names a folder takes from other distributions (our own package at its own source is not shadowing)."""
    return {name: owners for name, owners in names_from(folder).items() if owners != [DISTRIBUTION]}


def test_no_folder_at_the_repository_root_shadows_an_installed_distribution():
    assert shadowed(ROOT) == {}, "folders or modules at the repository root hide these installed distributions"


def test_the_check_finds_the_old_kernels_folder(tmp_path):
    """The layout before 2026-12-08: a package folder named kernels/ at the root, beside Hugging Face's `kernels`
    (transformers >= 5.25 requires it, so it is installed wherever the suite runs)."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text('"""ATMM"""\n')
    (tmp_path / "yaml.py").write_text("")  # a module shadows as well as a package (PyYAML's `yaml`)
    found = shadowed(tmp_path)
    assert found.get("kernels") == ["kernels"] and found.get("yaml") == ["pyyaml"], found


def test_from_the_root_kernels_is_hugging_faces_and_transformers_loads_the_backbone():
    """What a user does at the root: import Hugging Face's kernels, and load the default backbone (transformers
    imports `kernels` while it loads a model)."""
    code = ("import kernels, os; kernels.CUDAProperties; assert 'site-packages' in kernels.__file__, kernels.__file__\n"
            "from vlora_va.engine.backbones import load_backbone\n"
            "m = load_backbone('dinov2-small'); print(type(m).__name__, m.config.hidden_size)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1] == "384", r.stdout
