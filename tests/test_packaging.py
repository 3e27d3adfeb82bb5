"""Packaging: the wheel ships one import namespace, vlora_va, and nothing else.

Every package lives where it installs (vlora_va/ingest, vlora_va/kernels, ...) and is listed by hand in pyproject,
so a new folder that is not listed would silently be left out of the wheel: the fast tests compare the list with the
folders. The slow test builds the real wheel, installs it the way an ingest host does (no torch, from the ingest
lock) next to Hugging Face's `kernels` package, and checks that the two do not collide. What a folder at the
repository root would shadow, in the checkout itself: tests/test_shadowing.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
DISTRIBUTION = "vlora-va"
NAMESPACE = "vlora_va"
# Where the namespace lives in the repository: one folder, the installed layout itself.
SOURCE_FOLDERS = {"vlora_va": "vlora_va"}


def setuptools_config() -> dict:
    with PYPROJECT.open("rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def package_name(folder: Path) -> str:
    """The installed package name of a folder inside one of SOURCE_FOLDERS, e.g. vlora_va/ingest -> vlora_va.ingest."""
    for package, source in SOURCE_FOLDERS.items():
        base = ROOT / source
        if folder == base or base in folder.parents:
            return ".".join((package, *folder.relative_to(base).parts))
    raise ValueError(f"{folder} is in none of {sorted(SOURCE_FOLDERS.values())}")


def python_folders() -> list[Path]:
    """Every folder under SOURCE_FOLDERS that holds Python files (what the import graph and the wheel must cover)."""
    folders = set()
    for source in SOURCE_FOLDERS.values():
        folders.update(p.parent for p in (ROOT / source).rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(folders)


def folders_without_init() -> list[str]:
    return [str(folder) for folder in python_folders() if not (folder / "__init__.py").exists()]


def packages_on_disk() -> set[str]:
    return {package_name(folder) for folder in python_folders() if (folder / "__init__.py").exists()}


def packages_listed() -> list[str]:
    return setuptools_config()["packages"]


def test_no_package_is_installed_from_another_folder():
    """A package-dir mapping would put a package's source outside vlora_va/ (as streams/ and kernels/ once were):
    a second place to look, and a root folder importable under its own name."""
    assert "package-dir" not in setuptools_config()


def test_every_folder_with_python_files_is_a_package():
    """Without an __init__.py a folder is left out of the wheel (the packages list names packages) and out of
    the import graph tests/test_layers.py checks."""
    assert folders_without_init() == [], "folders with Python files but no __init__.py"


def test_the_packages_list_names_every_package_folder_and_nothing_else():
    listed = packages_listed()
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({p for p in listed if listed.count(p) > 1})}"
    on_disk = packages_on_disk()
    assert sorted(set(listed) - on_disk) == [], "listed in pyproject's packages, but no such package folder"
    assert sorted(on_disk - set(listed)) == [], "package folders missing from pyproject's packages list"


def test_every_listed_package_is_inside_the_one_namespace():
    outside = [p for p in packages_listed() if p != NAMESPACE and not p.startswith(NAMESPACE + ".")]
    assert outside == []


def test_the_folder_checks_see_a_new_folder(tmp_path, monkeypatch):
    """A copy of vlora_va/ingest with a new package folder and a new folder that is not a package: the comparison
    names the first as vlora_va.ingest.<name>, the __init__ check the second."""
    copy = tmp_path / "ingest"
    shutil.copytree(ROOT / "vlora_va" / "ingest", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setitem(SOURCE_FOLDERS, "vlora_va.ingest", str(copy))
    (copy / "rtsp").mkdir()
    (copy / "rtsp" / "__init__.py").write_text("")
    (copy / "loose").mkdir()
    (copy / "loose" / "decode.py").write_text("")
    # (filtered to the copy: the rest of the tree is what the tests above judge)
    assert {p for p in packages_on_disk() - set(packages_listed()) if p.startswith("vlora_va.ingest")} \
        == {"vlora_va.ingest.rtsp"}
    assert [f for f in folders_without_init() if f.startswith(str(copy))] == [str(copy / "loose")]


# --- the real wheel, installed as an ingest host installs it -------------------------------------------------

INSTALL_TIMEOUT_S = 1200  # av and OpenCV wheels on a cold pip cache, on shared cores
THIRD_PARTY = "kernels"  # Hugging Face's kernel hub client: the top-level name our kernels/ once claimed


def _clean_env() -> dict:
    """Nothing of this venv (or of the checkout) may leak into the throwaway one."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(args: list, cwd: Path, timeout: float = INSTALL_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def _require_pypi(scratch: Path) -> None:
    """Skips when pip cannot reach its index, except under CI (env CI set), where that is a failure."""
    r = _run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", scratch, THIRD_PARTY], cwd=scratch,
             timeout=300)
    if r.returncode != 0:
        message = f"PyPI is not reachable (pip download {THIRD_PARTY} failed): {r.stderr.strip()[-800:]}"
        unavailable(message)


def _copy_sources(dest: Path) -> Path:
    """What the build reads, copied: building in the checkout would leave build/ there, and setuptools packs
    whatever a stale build/lib still holds (a module moved away since) into the next wheel."""
    shutil.copy2(PYPROJECT, dest / "pyproject.toml")
    shutil.copy2(ROOT / "README.md", dest / "README.md")
    for source in SOURCE_FOLDERS.values():
        shutil.copytree(ROOT / source, dest / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


_PROBE = """
import importlib.metadata as md, json, pathlib, re
import vlora_va, vlora_va.ingest.worker, kernels
try:
    import torch
    torch_error = None
except ImportError as e:
    torch_error = repr(e)
dists = {top: sorted({re.sub(r"[-_.]+", "-", d).lower() for d in names})
         for top, names in md.packages_distributions().items()}
print(json.dumps({
    "vlora_va": vlora_va.__file__,
    "worker": vlora_va.ingest.worker.__file__,
    "kernels": kernels.__file__,
    "tops_of_vlora_va": sorted(top for top, names in dists.items() if "vlora-va" in names),
    "dists_of_kernels": dists.get("kernels", []),
    "torch_error": torch_error,
}))
"""


@pytest.fixture(scope="module")
def ingest_install(tmp_path_factory):
    """The wheel built from this checkout and a fresh venv with the ingest lock, the wheel and `kernels` installed in
    it; every command runs outside the checkout, so nothing is imported from it."""
    work = tmp_path_factory.mktemp("wheel")
    _require_pypi(work)
    sources = _copy_sources(tmp_path_factory.mktemp("src"))
    wheels = work / "dist"
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, sources], cwd=work)
    assert r.returncode == 0, f"building the wheel failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (wheel,) = wheels.glob("vlora_va-*.whl")
    venv = work / "venv"
    r = _run([sys.executable, "-m", "venv", venv], cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    python = venv / "bin" / "python"
    # as scripts/setup.sh installs an ingest venv: the ingest lock by hash, then the package without resolving
    r = _run([python, "-m", "pip", "install", "--require-hashes", "--no-deps", "-r",
              ROOT / "requirements" / "ingest.txt"], cwd=work)
    assert r.returncode == 0, f"installing the ingest lock failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    kernels = next(line.split()[0] for line in (ROOT / "requirements" / "test.txt").read_text().splitlines()
                   if line.startswith(f"{THIRD_PARTY}=="))
    r = _run([python, "-m", "pip", "install", "--no-deps", wheel], cwd=work)
    assert r.returncode == 0, f"installing the wheel failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    r = _run([python, "-m", "pip", "install", kernels], cwd=work)  # the version the lock holds, beside transformers
    assert r.returncode == 0, f"installing {kernels} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    r = _run([python, "-c", _PROBE], cwd=work, timeout=300)
    assert r.returncode == 0, f"importing from the install failed:\n{r.stderr[-3000:]}"
    return {"wheel": wheel, "venv": venv, "probe": json.loads(r.stdout.strip().splitlines()[-1])}


@pytest.mark.slow
def test_the_wheel_holds_only_the_vlora_va_namespace(ingest_install):
    with zipfile.ZipFile(ingest_install["wheel"]) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
    assert sorted(t for t in tops if not t.endswith((".dist-info", ".data"))) == [NAMESPACE]


@pytest.mark.slow
def test_ingest_and_hugging_face_kernels_import_side_by_side(ingest_install):
    probe, venv = ingest_install["probe"], ingest_install["venv"].resolve()
    for key in ("vlora_va", "worker", "kernels"):  # both come from the throwaway venv, not from the checkout
        assert venv in Path(probe[key]).resolve().parents, (key, probe[key])
    assert NAMESPACE not in Path(probe["kernels"]).parts, probe["kernels"]
    assert probe["dists_of_kernels"] == ["kernels"]


@pytest.mark.slow
def test_vlora_va_is_the_only_top_level_name_of_the_distribution(ingest_install):
    assert ingest_install["probe"]["tops_of_vlora_va"] == [NAMESPACE]


@pytest.mark.slow
def test_an_ingest_install_has_no_torch(ingest_install):
    error = ingest_install["probe"]["torch_error"]
    assert error is not None and "torch" in error, "torch imports in an ingest-only install"
