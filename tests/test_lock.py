"""The lock (requirements/*.txt): the set-up's environments equal it, and it satisfies pyproject.toml's ranges.

scripts/setup.sh installs lock files by hash and records which in each venv; vlora_va.testing.lockfile compares a
venv with its record's files and names every package that differs. Here: the real venvs of this checkout (.venv
and .venv-ingest), the comparison on made-up cases (each kind of difference is named), and every pin of a direct
requirement inside its pyproject range (a lock left behind by an edit of pyproject.toml fails).
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import unavailable
from tests.test_packaging import PYPROJECT, ROOT
from vlora_va.testing import lockfile as L

LOCKS = ROOT / "requirements"
VENV = Path(sys.prefix)  # the venv running the tests: .venv under `make test`
INGEST_VENV = ROOT / ".venv-ingest"


def _venv_or_skip(venv: Path) -> Path:
    if (venv / L.RECORD).is_file():
        return venv
    unavailable(f"{venv} was not set up by scripts/setup.sh (no {L.RECORD}): nothing to compare with the lock")


def test_the_test_venv_equals_the_lock():
    venv = _venv_or_skip(VENV)
    record = L.read_record(venv)
    # requirements/ or, during `make upgrade`, the candidate it tries (build/upgrade/requirements/)
    assert record["files"][0].endswith(("requirements/test.txt", "requirements/run.txt")), record
    assert L.check(venv, ROOT) == []


def test_the_ingest_venv_equals_the_ingest_lock_and_has_no_torch():
    venv = _venv_or_skip(INGEST_VENV)
    assert L.check(venv, ROOT) == []
    _, installed = L.read_venv(venv)
    assert "torch" not in installed and "av" in installed


def test_every_kind_of_difference_is_named(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("numpy==2.4.6 \\\n    --hash=sha256:00\n    # via x\npyyaml==6.0.4 \\\n    --hash=sha256:11\n"
                    "cffi==2.1.1 ; implementation_name == 'pypy' \\\n    --hash=sha256:22\n")
    env = {"implementation_name": "cpython", "python_version": "3.11", "sys_platform": "linux"}
    pins = L.locked([lock], env)
    assert pins == {"numpy": "2.4.6", "pyyaml": "6.0.4"}  # cffi's marker does not hold on CPython
    installed = {"numpy": "2.4.5", "pyzmq": "27.3.0", "pip": "23.2.1", "vlora-va": "0.1.0"}
    assert L.differences(pins, installed, L.EXEMPT) == [
        "numpy: locked 2.4.6, installed 2.4.5", "pyyaml: locked 6.0.4, not installed",
        "pyzmq: installed 27.3.0, not in the lock"]
    assert L.differences(pins, {"numpy": "2.4.6", "pyyaml": "6.0.4", "pip": "1"}, L.EXEMPT) == []


def test_two_lock_files_that_disagree_are_refused(tmp_path):
    (tmp_path / "a.txt").write_text("numpy==2.4.6\n")
    (tmp_path / "b.txt").write_text("numpy==2.4.5\n")
    with pytest.raises(ValueError, match="numpy==2.4.5, but another lock file pins 2.4.6"):
        L.locked([tmp_path / "a.txt", tmp_path / "b.txt"], {})


@pytest.mark.parametrize("marker, holds", [
    ("sys_platform == 'linux'", True),
    ("platform_machine == 'aarch64' or platform_machine == 'x86_64'", True),
    ("python_full_version < '3.15' and sys_platform == 'linux'", True),
    ("python_full_version < '3.11.3'", False),  # 3.11.7: numbers, not strings ('3.11.7' < '3.11.3' as text too)
    ("python_full_version >= '3.9'", True),  # as text '3.11.7' < '3.9'
    ("(sys_platform == 'darwin' and platform_machine == 'arm64') or implementation_name == 'pypy'", False),
])
def test_markers_of_the_lock_files(marker, holds):
    env = {"sys_platform": "linux", "platform_machine": "x86_64", "python_full_version": "3.11.7",
           "implementation_name": "cpython"}
    assert L._marker_holds(marker, env) is holds


def test_a_marker_it_cannot_read_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="not understood"):
        L._marker_holds("sys_platform ~= 'linux' or __import__('os')", {"sys_platform": "linux"})


def _direct_requirements() -> dict[str, list[Requirement]]:
    """{extra or "": requirements} of pyproject.toml (self-references like vlora-va[all] left out)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {g: [Requirement(r) for r in reqs if not r.startswith("vlora-va")] for g, reqs in groups.items()}


@pytest.mark.parametrize("lock, groups", [
    ("test.txt", ["", "ingest", "daemon", "dashboard", "calibrate", "cluster", "train", "test", "bench"]),
    ("run.txt", ["", "ingest", "daemon", "dashboard", "calibrate"]),
    ("run-cuda.txt", ["", "ingest", "daemon", "dashboard", "calibrate"]),
    ("ingest.txt", ["", "ingest"]),
])
def test_each_lock_file_pins_every_direct_requirement_inside_its_range(lock, groups):
    env = {"implementation_name": "cpython", "python_version": "3.11", "python_full_version": "3.11.7",
           "platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix"}
    pins = L.locked([LOCKS / lock], env)
    problems = []
    for group in groups:
        for req in _direct_requirements()[group]:
            if req.marker and not req.marker.evaluate({**env, "extra": group}):
                continue
            name = L.canonical(req.name)
            if name == "torch" and lock != "run-cuda.txt":
                continue  # from TORCH_SPEC, pinned in requirements/torch.in
            if name not in pins:
                problems.append(f"{group or 'dependencies'}: {req} is not in {lock}")
            elif not req.specifier.contains(pins[name], prereleases=True):
                problems.append(f"{group or 'dependencies'}: {req}, but {lock} pins {pins[name]}")
    assert problems == [], "the lock is stale: run `make lock`"


def test_every_pin_carries_a_hash():
    for path in sorted(LOCKS.glob("*.txt")):
        text = path.read_text()
        for block in re.split(r"\n(?=[A-Za-z0-9])", text):
            if L._PIN.match(block.splitlines()[0]):
                assert "--hash=sha256:" in block, f"{path.name}: {block.splitlines()[0]} has no hash"


def test_the_lock_holds_transformers_with_hugging_faces_kernels():
    """The release that broke the suite (5.25, which needs `kernels`) is what the lock holds: the product works with
    today's libraries rather than avoiding them."""
    pins = L.locked([LOCKS / "test.txt"], {})
    major, minor = map(int, pins["transformers"].split(".")[:2])
    assert (major, minor) >= (5, 25) and "kernels" in pins, json.dumps({k: pins.get(k)
                                                                          for k in ("transformers", "kernels")})


def test_moves_names_what_a_new_lock_changes_and_says_nothing_when_nothing_moved(tmp_path, capsys):
    """scripts/upgrade.sh reads an empty output as "nothing moved" (and then runs no suite)."""
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("numpy==2.4.5 \\\n    --hash=sha256:00\nav==18.1.1\n")
    new.write_text("numpy==2.4.6 \\\n    --hash=sha256:11\nkernels==0.19.1\n")
    assert L.moves(old, new) == ["numpy 2.4.5 -> 2.4.6", "+ kernels 0.19.1", "- av 18.1.1"]
    assert L.main(["moves", str(old), str(old)]) == 0 and capsys.readouterr().out == ""
