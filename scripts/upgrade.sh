#!/usr/bin/env bash
# `make upgrade`: move the lock forward. Re-resolves every lock file to the newest versions within pyproject's ranges
# (into build/upgrade/requirements), installs them into .venv and .venv-ingest, and runs the whole suite under CI=true.
# Green: the new files replace requirements/*.txt (commit them). Red: requirements/ is left as it was, the venvs go
# back to it, and what broke is printed with what moved. PYTEST_ARGS narrows the run (a trial; never for a commit).
set -euo pipefail
cd "$(dirname "$0")/.."
CAND=build/upgrade/requirements
LOG=build/upgrade/pytest.log
rm -rf build/upgrade && mkdir -p "$CAND"
UPGRADE=1 LOCK_OUT="$CAND" bash scripts/lock.sh
echo "[upgrade] what moved (test.txt; ingest.txt and run.txt take the same versions):"
.venv/bin/python -m vlora_va.testing.lockfile moves requirements/test.txt "$CAND/test.txt" | tee build/upgrade/moved.txt
.venv/bin/python -m vlora_va.testing.lockfile moves requirements/run-cuda.txt "$CAND/run-cuda.txt" > build/upgrade/moved-cuda.txt
if [ ! -s build/upgrade/moved.txt ] && [ ! -s build/upgrade/moved-cuda.txt ] \
    && cmp -s requirements/ingest.txt "$CAND/ingest.txt" && cmp -s requirements/no-deps.txt "$CAND/no-deps.txt"; then
  echo "[upgrade] nothing moved: the lock is the newest there is"
  exit 0
fi

install() {  # the lock files in DIR into .venv and .venv-ingest, recorded, what they do not hold removed
  local dir=$1
  local PIP=(-m pip install --disable-pip-version-check --quiet --require-hashes --no-deps)
  .venv/bin/python "${PIP[@]}" -r "$dir/test.txt" -r "$dir/no-deps.txt"
  printf '{"files": ["%s/test.txt", "%s/no-deps.txt"], "torch": "2.13.0"}\n' "$dir" "$dir" > .venv/vlora-va-lock.json
  .venv/bin/python -m vlora_va.testing.lockfile sync .venv
  .venv-ingest/bin/python "${PIP[@]}" -r "$dir/ingest.txt"
  printf '{"files": ["%s/ingest.txt"], "torch": null}\n' "$dir" > .venv-ingest/vlora-va-lock.json
  .venv/bin/python -m vlora_va.testing.lockfile sync .venv-ingest
}

echo "[upgrade] installing the candidate and running the whole suite (CI=true; about 30 minutes on 2 cores)"
install "$CAND"
# shellcheck disable=SC2086
if CI=true .venv/bin/python -m pytest -q ${PYTEST_ARGS:-} 2>&1 | tee "$LOG"; then
  if [ -n "${PYTEST_ARGS:-}" ]; then
    echo "[upgrade] green on a narrowed run (PYTEST_ARGS): requirements/ not changed"
    install requirements
    exit 0
  fi
  cp "$CAND"/*.txt requirements/
  install requirements
  echo "[upgrade] green: requirements/ moved forward (commit it). What moved: build/upgrade/moved*.txt"
else
  echo "[upgrade] RED: requirements/ not changed. What broke:"
  grep -E "^(FAILED|ERROR) " "$LOG" || tail -30 "$LOG"
  echo "[upgrade] with these moves:"
  cat build/upgrade/moved.txt
  install requirements
  exit 1
fi
