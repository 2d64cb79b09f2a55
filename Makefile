# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make book   install into .venv, execute every chapter, build the HTML
#   make test   install, then the unit tests and nbval over every notebook (one session; the training
#               chapters on another machine's arithmetic) and, beside them, the strict book build from
#               the stored outputs and the browser test of that build (when a Chromium is installed;
#               skipped, and said so, when not)
# Also: make notebooks (re-execute and tidy the chapters), make reader (rewrite their plain-Markdown
# edition in book/reader/), make lab (open that edition in JupyterLab).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JB     := $(BIN)/jupyter-book
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: book test unit nbval checks nbval-training nbval-perturbed nbval-default-isa fresh-training-cache strict-book strict-book-stored browser-test instructor-book notebooks reader lab install clean

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip installs on one core. So torch, triton and the packages only torch needs install in a second pip
# beside the first, which installs the rest of requirements.txt with its dependencies: the two halves
# take about as long each (104 s -> 66 s in a fresh venv here). The two share no package: the first
# half has --no-deps, and nothing in the second needs what it installs. The last pip call resolves
# requirements.txt as a whole: it installs anything the split left out and replaces any version
# that breaks a requirement (on a machine whose torch needs other packages, say), and pip check
# confirms it. The same packages, same versions, as one `pip install -r requirements.txt` here.
TORCH_REQUIREMENTS := '^(torch|triton)[=<>!~ ;]'
TORCH_ONLY := sympy networkx mpmath fsspec filelock
$(STAMP): requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	grep -E $(TORCH_REQUIREMENTS) requirements.txt > $(VENV)/requirements-torch.txt
	grep -v -E $(TORCH_REQUIREMENTS) requirements.txt > $(VENV)/requirements-rest.txt
	$(BIN)/python -m pip install --quiet --no-deps -r $(VENV)/requirements-torch.txt $(TORCH_ONLY) & torch=$$!; \
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements-rest.txt; rest=$$?; \
	wait $$torch && [ $$rest -eq 0 ]
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip check
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

book: $(STAMP)
	$(JB) build . --builder html
	@echo "The book is at $(CURDIR)/_build/html/index.html"

unit: $(STAMP)
	$(BIN)/python -m pytest tests -q -n 2 --dist loadscope

nbval: $(STAMP)
	$(BIN)/python -m pytest --nbval book -q -p no:cacheprovider -p tools.nbval_retry -n 2 --dist loadscope

# The chapters that report trained models (they import attnlib.learn; tests/test_training_robustness.py
# checks that the list is complete). What they print must not depend on the CPU's rounding, so nbval
# runs them on another machine's arithmetic (in make test's checks, below), two changes at once:
# every model's initial weights changed by a relative 1e-9 before training
# (attnlib.learn.training.perturb_initial_weights), and torch's and MKL's kernels on their plain
# code paths (no AVX), which round some sums differently.
# `make nbval-training` runs them so alone; each change alone: `make nbval-perturbed` and
# `make nbval-default-isa`. No notebook sets these variables.
TRAINING_CHAPTERS := book/00_welcome.ipynb book/05_weighted_sum.ipynb book/06_matrix_form.ipynb book/07_attention_that_learns.ipynb book/08_attention_inside_a_transformer.ipynb book/09_generating_text.ipynb book/10_a_gpt_that_writes.ipynb book/15_decoding_at_scale.ipynb
PERTURBED   := ATTNLIB_PERTURB_INITIAL_WEIGHTS=1e-9
DEFAULT_ISA := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE
NBVAL_TRAINING := $(BIN)/python -m pytest --nbval $(TRAINING_CHAPTERS) -q -p no:cacheprovider -p tools.nbval_retry -n 2 --dist loadscope
nbval-training: $(STAMP)
	$(PERTURBED) $(DEFAULT_ISA) $(NBVAL_TRAINING)
nbval-perturbed: $(STAMP)
	$(PERTURBED) $(NBVAL_TRAINING)
nbval-default-isa: $(STAMP)
	$(DEFAULT_ISA) $(NBVAL_TRAINING)

# make test's checks: the unit tests and nbval over every notebook in one pytest session, so that
# the two workers stay busy from the first file to the last (xdist hands out the files with the most
# tests first; handing out the slowest first, an explicit list, measured no faster here). The training
# chapters' kernels run on the other arithmetic (both changes at once; tools/nbval_kernels.py),
# every other notebook's on this machine's. That replaces a second session of the training chapters
# after the first (4 minutes here): the code those chapters show still runs on this machine's
# arithmetic in their reader's edition (book/reader/: the same cells and stored outputs, without the
# cells the book removes and the solutions, which tests/test_exercises.py runs). `make nbval` runs
# every notebook on this machine's arithmetic alone. The edition's kernels draw no figures
# (--no-drawing): nbval compares no pictures, and the book's notebooks draw the same figure code
# in the same session (about 0.6 s a figure here).
# -p tools.nbval_retry, in every nbval run: a notebook's kernel that dies while it starts (another
# socket took one of its ports first; it happened once here) is started again; tools/nbval_retry.py.
# -p tools.same_worker: notebooks that load one training (the first to run trains and stores it; see
# TRAINING_CACHE below) run in turn on one worker, so that none idles while the other trains.
SAME_WORKER = --same-worker="book/00_welcome.ipynb book/05_weighted_sum.ipynb book/06_matrix_form.ipynb book/07_attention_that_learns.ipynb" \
	  --same-worker="book/08_attention_inside_a_transformer.ipynb book/09_generating_text.ipynb" \
	  --same-worker="book/reader/00_welcome.ipynb book/reader/05_weighted_sum.ipynb book/reader/06_matrix_form.ipynb book/reader/07_attention_that_learns.ipynb" \
	  --same-worker="book/reader/08_attention_inside_a_transformer.ipynb book/reader/09_generating_text.ipynb"
CHECKS = $(BIN)/python -m pytest --nbval book tests -q -p no:cacheprovider -p tools.nbval_retry -n 2 --dist loadscope \
	  -p tools.nbval_kernels --other-arithmetic="$(TRAINING_CHAPTERS)" --other-arithmetic-env="$(PERTURBED) $(DEFAULT_ISA)" \
	  --no-drawing=book/reader -p tools.same_worker $(SAME_WORKER)
checks: $(STAMP)
	$(CHECKS)

# The same book without any solution, for instructors: `hide_solutions` flipped in a copy of _config.yml.
instructor-book: $(STAMP)
	mkdir -p _build/instructor
	sed 's/hide_solutions: false/hide_solutions: true/' _config.yml > _build/instructor/_config.yml
	grep -q "hide_solutions: true" _build/instructor/_config.yml
	$(JB) build . --builder html --config _build/instructor/_config.yml --path-output _build/instructor
	@echo "The instructors' book (no solutions) is at $(CURDIR)/_build/instructor/_build/html/index.html"

strict-book: $(STAMP)
	$(JB) build . --builder html --all -W -n --keep-going

# The same strict build inside `make test`, from the stored outputs: nbval, in the same make test,
# executes every chapter and compares every output with the stored one, so another execution here
# would repeat that check (about 4 minutes on 2 cores). `make book` and `make strict-book` still
# execute every chapter.
STORED_CONFIG := _build/stored-outputs/_config.yml
STRICT_BOOK_STORED = mkdir -p _build/stored-outputs && \
	sed 's/execute_notebooks: force/execute_notebooks: "off"/' _config.yml > $(STORED_CONFIG) && \
	grep -q 'execute_notebooks: "off"' $(STORED_CONFIG) && \
	$(JB) build . --builder html --all -W -n --keep-going --config $(STORED_CONFIG)
strict-book-stored: $(STAMP)
	$(STRICT_BOOK_STORED)

# Headless Chromium opens every page of the strict build (_build/html) offline, 390 px wide, then
# widens the same window to 1280 px, and checks both: math typeset, images loaded, nothing wider
# than the column, interactive figures react, no console errors, solutions collapsed. Needs
# `make strict-book` first.
BROWSER_TEST = if ! $(BIN)/python -c "from tools.browser import find_chromium; raise SystemExit(find_chromium() is None)"; then \
	  echo "make test: SKIPPED the browser test: no Chromium found (apt-get install chromium)"; \
	elif [ ! -f _build/html/index.html ]; then \
	  echo "make browser-test: no built book in _build/html; run make strict-book first" >&2; exit 1; \
	else \
	  BOOK_HTML=$(CURDIR)/_build/html $(BIN)/python -m pytest tests/test_browser.py -q -p no:cacheprovider; \
	fi
browser-test: $(STAMP)
	@$(BROWSER_TEST)

# Two pytest workers share the machine's 2 cores, and torch and NumPy each start one thread per core:
# four busy threads on two cores, whose OpenMP threads spin while they wait. One thread per worker
# halved the wall time of the heaviest unit tests here (farm-bench, 3 paired runs: A/B wall 0.51).
# Nothing a test or a chapter checks depends on the thread count (the training chapters and the
# benchmarks set one thread themselves, and the tests of that set other counts explicitly).
unit nbval checks test nbval-training nbval-perturbed nbval-default-isa: export OMP_NUM_THREADS := 1

# Within `make test` each training runs once: chapter 9 retrains chapter 8's model, chapters 5 and 6
# chapter 7's, the reader's edition reruns every chapter and the unit tests train the same recipes.
# The first run stores its result in this folder, and every equal call after it, in any process,
# loads it (attnlib.learn.memo: keyed on the arguments, the library's source, the versions and the
# arithmetic's environment variables, so the perturbed run trains its own). Emptied when `make test`
# starts; readers and `make book` never set it.
TRAINING_CACHE := $(CURDIR)/_build/training-cache
checks test nbval-training: export ATTNLIB_TRAINING_CACHE := $(TRAINING_CACHE)
fresh-training-cache:
	rm -rf $(TRAINING_CACHE)

# The strict build from the stored outputs and then the browser test run beside the checks session,
# which is niced so that the browser's page loads do not wait behind it: the browser test's own
# process mostly waits for Chromium (the two use about 97 CPU-seconds in 72 s here). Their report,
# kept in _build/book-and-browser.log, is printed after the checks'. The strict build renders the stored
# outputs while nbval compares them with a fresh run: a difference fails make test all the same.
# (No $$(MAKE) in this recipe: `make -n test`, which the tests read, would run such a line.)
BROWSER_LOG := _build/book-and-browser.log
test: fresh-training-cache $(STAMP)
	@echo "make test: the strict build, then the browser test, run beside the checks; their report follows"
	@mkdir -p _build; ( $(STRICT_BOOK_STORED) && $(BROWSER_TEST) ) > $(BROWSER_LOG) 2>&1 & browser=$$!; \
	nice -n 10 $(CHECKS); checks=$$?; \
	wait $$browser; browser=$$?; \
	echo "--- the strict build and the browser test ($(BROWSER_LOG)):"; cat $(BROWSER_LOG); \
	if [ $$checks -ne 0 ] || [ $$browser -ne 0 ]; then \
	  echo "make test: FAILED (checks exit $$checks, strict build and browser test exit $$browser)"; exit 1; \
	fi
	@echo "make test: the strict build, unit tests, nbval and the browser check are done"

# Re-execute every chapter in place, so the stored outputs match a fresh run (nbval checks this):
# first each chapter's set-up cell from _config.yml, then the run, then what the reader sees
# (nbval markers as tags, long listings collapsed) and the glued numbers written into the prose.
notebooks: $(STAMP)
	$(BIN)/python tools/colab_setup.py
	$(BIN)/python tools/execute_notebooks.py book/*.ipynb
	$(BIN)/python tools/notebook_hygiene.py
	$(BIN)/python tools/sync_prose.py book/*.ipynb
	$(BIN)/python tools/reader_edition.py

# The reader's edition (book/reader/): every chapter with its MyST markup converted to plain Markdown
# and HTML, for Colab, GitHub and JupyterLab; the built book's Colab and download buttons open it.
reader: $(STAMP)
	$(BIN)/python tools/reader_edition.py

# The chapters' reader's edition in JupyterLab (installed on first use, pinned; not needed by book or
# test); JupyterLab shows MyST as text, so it opens book/reader/, not book/. As root (a container)
# JupyterLab refuses to start without --allow-root, so it gets that flag there.
# The prose shows the glued numbers there too: make notebooks writes them into the markdown.
JUPYTERLAB := jupyterlab==4.6.6
lab: $(STAMP)
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(JUPYTERLAB)"
	$(BIN)/jupyter lab --notebook-dir=book/reader $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

clean:
	rm -rf _build
