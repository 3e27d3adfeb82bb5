"""The lock (requirements/*.txt) against a virtualenv: every package that differs, by name.

scripts/setup.sh installs lock files by hash and records in the venv which ones (RECORD). `check` compares the
venv's installed distributions with those files:
  - a package the lock holds at another version, or that is not installed;
  - a package installed that the lock does not hold.
Exempt: vlora-va itself (installed editable from the checkout), pip (the venv's own) and, with LOCK=cpu, torch, which
TORCH_SPEC installs (pinned to 2.13.0; its version is checked against the record). A TORCH_SPEC other than the default (a CUDA
build) brings libraries the CPU lock does not hold: they are listed as differences, because they are not locked
(LOCK=cuda installs a locked CUDA build instead). `sync` uninstalls what the lock does not hold (left by an earlier
lock), so that a re-run set-up ends equal to the lock.

    python -m vlora_va.testing.lockfile check .venv          exit 1 and one line per difference
    python -m vlora_va.testing.lockfile sync .venv-ingest    uninstall what is not locked, then check
    python -m vlora_va.testing.lockfile moves OLD.txt NEW.txt  what a new lock file changes (make upgrade)

Standard library only: it also reads a venv that has no `packaging` (the ingest one), running that venv's Python to
list its distributions and the values of its environment markers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

RECORD = "vlora-va-lock.json"  # {"files": [lock files, relative to the repository], "torch": "2.13.0" or null}
EXEMPT = {"vlora-va", "pip"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]*?))?\s*\\?\s*$")

# The target interpreter's installed distributions and marker values (what packaging.markers.default_environment
# computes), as JSON.
_PROBE = r"""
import importlib.metadata as md, json, os, platform, sys
def version(info):
    v = "{0.major}.{0.minor}.{0.micro}".format(info)
    return v + (info.releaselevel[0] + str(info.serial) if info.releaselevel != "final" else "")
env = {"implementation_name": sys.implementation.name, "implementation_version": version(sys.implementation.version),
       "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
       "platform_system": platform.system(), "platform_version": platform.version(),
       "python_full_version": platform.python_version(), "platform_python_implementation": platform.python_implementation(),
       "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}
dists = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name:
        dists[name] = d.version
print(json.dumps({"env": env, "dists": dists}))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_holds(marker: str, env: dict[str, str]) -> bool:
    """A lock line's environment marker in this environment. uv writes simple ones (`name op 'value'` joined by
    and/or, in parentheses); versions compare as number tuples."""
    def value(token: str):
        token = token.strip()
        return token[1:-1] if token[:1] in "'\"" else env.get(token, "")

    def compare(a: str, op: str, b: str) -> bool:
        if op in ("<", "<=", ">", ">=") and re.fullmatch(r"[\d.]+", a) and re.fullmatch(r"[\d.]+", b):
            a, b = tuple(map(int, a.split("."))), tuple(map(int, b.split(".")))
        return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,
                "in": a in b, "not in": a not in b}[op]

    atom = re.compile(r"""([\w.]+|'[^']*'|"[^"]*")\s*(==|!=|<=|>=|<|>|not in|in)\s*([\w.]+|'[^']*'|"[^"]*")""")
    expr = atom.sub(lambda m: str(compare(value(m.group(1)), m.group(2), value(m.group(3)))), marker)
    if not re.fullmatch(r"[\s()]*(?:(?:True|False)[\s()]*(?:(?:and|or)[\s()]*)?)*", expr):
        raise ValueError(f"environment marker not understood: {marker!r}")
    return bool(eval(expr, {"__builtins__": {}}))  # only True/False/and/or/parentheses remain (checked above)


def locked(files: list[Path], env: dict[str, str]) -> dict[str, str]:
    """{canonical name: version} of the lock files' pins that apply in this environment."""
    pins: dict[str, str] = {}
    for path in files:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            m = _PIN.match(line)
            if not m:
                continue
            name, version, marker = canonical(m.group(1)), m.group(2), m.group(3)
            if marker and not _marker_holds(marker, env):
                continue
            if pins.get(name, version) != version:
                raise ValueError(f"{path}:{n}: {name}=={version}, but another lock file pins {pins[name]}")
            pins[name] = version
    return pins


def read_venv(venv: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(marker environment, {canonical name: version}) of the venv's interpreter."""
    r = subprocess.run([str(Path(venv) / "bin" / "python"), "-c", _PROBE], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{venv}: cannot list its distributions: {r.stderr.strip()[-1000:]}")
    data = json.loads(r.stdout)
    return data["env"], {canonical(k): v for k, v in data["dists"].items()}


def read_record(venv: Path) -> dict:
    path = Path(venv) / RECORD
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no record of which lock files scripts/setup.sh installed here")
    return json.loads(path.read_text())


def differences(pins: dict[str, str], installed: dict[str, str], exempt: set[str]) -> list[str]:
    """One line per package that differs, sorted by name."""
    out = []
    for name in sorted(set(pins) | set(installed)):
        if name in exempt:
            continue
        want, have = pins.get(name), installed.get(name)
        if want is None:
            out.append(f"{name}: installed {have}, not in the lock")
        elif have is None:
            out.append(f"{name}: locked {want}, not installed")
        elif have != want:
            out.append(f"{name}: locked {want}, installed {have}")
    return out


def check(venv: Path, root: Path) -> list[str]:
    record = read_record(venv)
    env, installed = read_venv(venv)
    pins = locked([root / f for f in record["files"]], env)
    torch = record.get("torch")  # the version TORCH_SPEC pins, where torch came from it rather than from the lock
    problems = differences(pins, installed, EXEMPT | ({"torch"} if torch else set()))
    if torch and installed.get("torch", "").split("+")[0] != torch:
        problems.append(f"torch: TORCH_SPEC pins {torch}, installed {installed.get('torch', 'nothing')}")
    return problems


def sync(venv: Path, root: Path) -> list[str]:
    """Uninstall what the lock does not hold; returns the names uninstalled."""
    extra = [line.split(":")[0] for line in check(venv, root) if line.endswith("not in the lock")]
    if extra:
        subprocess.run([str(Path(venv) / "bin" / "python"), "-m", "pip", "uninstall", "-y", "--quiet", *extra],
                       check=True)
    return extra


def moves(old: Path, new: Path) -> list[str]:
    """What a new lock file changes against an old one: 'name old -> new', '+ name version', '- name version'."""
    def pins(path: Path) -> dict[str, str]:
        return {canonical(m.group(1)): m.group(2) for line in Path(path).read_text().splitlines()
                if (m := _PIN.match(line))}

    a, b = pins(old), pins(new)
    out = [f"{n} {a[n]} -> {b[n]}" for n in sorted(set(a) & set(b)) if a[n] != b[n]]
    return out + [f"+ {n} {b[n]}" for n in sorted(set(b) - set(a))] + [f"- {n} {a[n]}" for n in sorted(set(a) - set(b))]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "moves":
        for line in moves(Path(args[1]), Path(args[2])):  # nothing at all when nothing moved (scripts/upgrade.sh)
            print(line)
        return 0
    if len(args) != 2 or args[0] not in ("check", "sync"):
        print(__doc__)
        return 2
    venv, root = Path(args[1]), Path.cwd()  # the record's file names are relative to the repository root
    if args[0] == "sync":
        removed = sync(venv, root)
        if removed:
            print(f"[setup] {venv}: uninstalled what the lock does not hold: {', '.join(removed)}")
    problems = check(venv, root)
    for line in problems:
        print(f"{venv}: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
