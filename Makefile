# Two commands do everything on a fresh machine with Python 3.11+ and make:
#   make book   install into .venv, execute every chapter, build the HTML
#   make test   install, unit tests, nbval over every notebook, strict book build

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JB     := $(BIN)/jupyter-book
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: book test unit nbval strict-book instructor-book notebooks install clean

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

book: $(STAMP)
	$(JB) build . --builder html
	@echo "The book is at $(CURDIR)/_build/html/index.html"

unit: $(STAMP)
	$(BIN)/python -m pytest tests -q -n 2 --dist loadscope

nbval: $(STAMP)
	$(BIN)/python -m pytest --nbval book -q -p no:cacheprovider -n 2 --dist loadscope

# The same book without any solution, for instructors: `hide_solutions` flipped in a copy of _config.yml.
instructor-book: $(STAMP)
	mkdir -p _build/instructor
	sed 's/hide_solutions: false/hide_solutions: true/' _config.yml > _build/instructor/_config.yml
	grep -q "hide_solutions: true" _build/instructor/_config.yml
	$(JB) build . --builder html --config _build/instructor/_config.yml --path-output _build/instructor
	@echo "The instructors' book (no solutions) is at $(CURDIR)/_build/instructor/_build/html/index.html"

strict-book: $(STAMP)
	$(JB) build . --builder html --all -W -n --keep-going

test: unit nbval strict-book
	@echo "make test: unit tests, nbval and the strict build all passed"

# Re-execute every chapter in place, so the stored outputs match a fresh run (nbval checks this).
notebooks: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py book/*.ipynb

clean:
	rm -rf _build
