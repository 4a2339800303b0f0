# rlkit: the entry points are `make demo` (run every notebook), `make test` (the test suite) and `make lab`
# (JupyterLab on nbs/). Each sets up .venv first. On a CPU machine torch==2.13.0 is the local CPU build;
# never let pip resolve a bare `torch` there (that pulls a multi-GB CUDA build).
#   make demo                      # every notebook with its tiny CPU profile
#   make demo PROFILE=h200         # on a CUDA machine (set TORCH/EXTRAS, see README)
#   make run NB=01_offload_bug P=h200 ARGS="-p steps=3"
#   make lab                       # JupyterLab on nbs/ with the project's kernel (.venv)
#   make lab LAB_ARGS="--no-browser --port 8890"   # on a remote machine

PYTHON  ?= python3
VENV    ?= .venv
PROFILE ?= tiny
TORCH   ?= torch==2.13.0
TORCH_PIP_ARGS ?=
EXTRAS  ?= verl,dev
BIN      = $(VENV)/bin

.PHONY: setup demo test lab gpu-test run clean-check browser-deps verl-compat

setup: $(VENV)/.rlkit-installed

$(VENV)/.rlkit-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)" $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

demo: setup
	$(BIN)/rlkit run --all --profile $(PROFILE) --quiet

test: setup
	$(BIN)/python -m pytest -m "not gpu" -q

lab: setup
	$(BIN)/jupyter lab --notebook-dir=nbs $(LAB_ARGS)

# verl's own CPU tests from its PyPI sdist, three ways: stock, rlkit installed with nothing selected, every patch
# selected; fails on a test that passes stock and not with rlkit (results: outputs/verl_compat/<tag>/).
verl-compat: setup
	$(BIN)/python -m rlkit.tools.verl_compat $(ARGS)

gpu-test: setup
	$(BIN)/python -m pytest -m gpu -q

run: setup
	$(BIN)/rlkit run $(NB) --profile $(or $(P),$(PROFILE)) $(ARGS)

clean-check: setup
	$(BIN)/python -m pytest -q tests/test_notebooks.py -k stripped

# Debian's chromium + chromedriver (root): the browser tier (tests/test_browser.py) and the PNGs kaleido draws
# beside every plotly figure. Without them those tests skip, saying why, and figures stay interactive only.
browser-deps:
	bash scripts/ci_browser_setup.sh
