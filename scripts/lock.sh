#!/usr/bin/env bash
# Resolve requirements/*.txt, the lock scripts/setup.sh installs by hash (requirements/README.md says what each holds).
#   scripts/lock.sh                 re-resolve after a change to pyproject.toml or requirements/*.in, keeping every
#                                   version already locked that still fits (uv's preference for the output's pins)
#   UPGRADE=1 scripts/lock.sh       the newest version of everything within pyproject's ranges (make upgrade)
#   LOCK_OUT=DIR                    write into DIR instead of requirements/ (make upgrade writes a candidate there)
# Needs uv (the test extra installs it into .venv; UV=/path/to/uv otherwise) and the package index. torch's CPU build
# is taken from pip's find-links folder where one holds it (/opt/wheels on the reference machines), else from
# PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
OUT=${LOCK_OUT:-requirements}
UPGRADE=${UPGRADE:-0}
IN=requirements
PY=3.11  # the reference machines' CPython; other versions install the same pins where wheels exist
[ -x "$UV" ] || { echo "lock: no uv at $UV (make setup-test installs it, or set UV=)"; exit 2; }
mkdir -p "$OUT"
# Without --upgrade, uv prefers the pins of the file it writes: start from the current lock.
if [ "$OUT" != "$IN" ]; then cp "$IN"/*.txt "$OUT"/ 2>/dev/null || true; fi

TORCH_CPU=()
if ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  TORCH_CPU=(--find-links /opt/wheels)
else
  TORCH_CPU=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi
COMMON=(--generate-hashes --python-version "$PY" --quiet --custom-compile-command "scripts/lock.sh")
[ "$UPGRADE" = 1 ] && COMMON+=(--upgrade)
X86=(--python-platform x86_64-manylinux_2_28)

compile() {  # OUTPUT_NAME, then uv pip compile's inputs and options
  local name=$1; shift
  echo "lock: $OUT/$name"
  "$UV" pip compile "${COMMON[@]}" "$@" -o "$OUT/$name"
  # the pins file is a temporary one: its name in the "via" notes would change the file on every run
  sed -i '/^ *#   -c .*-pins\.txt$/d; /^ *# via -c .*-pins\.txt$/d' "$OUT/$name"
}

# 1. Everything `make test` installs (the daemon, ingest, train, bench, cluster and the test tools), CPU x86_64; torch
#    itself comes from TORCH_SPEC (scripts/setup.sh), its dependencies from here.
compile test.txt pyproject.toml "$IN/setup.in" "$IN/build.in" --extra all --extra test --extra bench --extra train --extra cluster \
  -c "$IN/torch.in" --no-emit-package torch "${TORCH_CPU[@]}" "${X86[@]}"
# The others take test.txt's versions (one set of versions across the lock): its pins, without hashes, as constraints.
PINS=$(mktemp --suffix=-pins.txt)
trap 'rm -f "$PINS"' EXIT
grep -E '^[A-Za-z0-9._-]+==' "$OUT/test.txt" | sed 's/ .*//' > "$PINS"
# 2. What `make run` installs: the daemon with its dashboard and calibration, ingest, the backbone builder.
compile run.txt pyproject.toml "$IN/setup.in" "$IN/build.in" --extra all -c "$IN/torch.in" -c "$PINS" --no-emit-package torch \
  "${TORCH_CPU[@]}" "${X86[@]}"
# 3. An ingest-only host (no torch), for Linux, macOS and Windows on any CPU.
compile ingest.txt pyproject.toml "$IN/build.in" --extra ingest -c "$PINS" --universal
# 4. The packages installed --no-deps (requirements/no-deps.in says why).
compile no-deps.txt "$IN/no-deps.in" --no-deps --universal
# 5. GPU machines: what `make run` installs with torch 2.13.0 as PyPI builds it (CUDA), with its CUDA libraries, for
#    Linux x86_64 and aarch64 (LOCK=cuda in scripts/setup.sh). Resolved on its own: CUDA torch pins its own triton.
compile run-cuda.txt pyproject.toml "$IN/setup.in" "$IN/build.in" --extra all -c "$IN/torch.in" --universal
echo "lock: done ($OUT)"
