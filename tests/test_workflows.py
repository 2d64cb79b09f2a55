"""The GitHub workflows: one publishes the book built by `make book`, one runs `make test`."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def _load(name):
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as True
    return workflow


def _runs(job):
    return [step["run"] for step in job["steps"] if "run" in step]


def _uses(job):
    return [step["uses"].split("@")[0] for step in job["steps"] if "uses" in step]


@pytest.fixture(scope="module")
def pages():
    return _load("pages.yml")


@pytest.fixture(scope="module")
def test_workflow():
    return _load("test.yml")


def test_the_test_workflow_runs_make_test_on_every_push_and_pull_request(test_workflow):
    assert "push" in test_workflow["on"] and "pull_request" in test_workflow["on"]
    for event in ("push", "pull_request"):
        assert not (test_workflow["on"][event] or {}).get("branches"), f"{event} is limited to some branches"
    runs = [run for job in test_workflow["jobs"].values() for run in _runs(job)]
    assert "make test" in runs


def test_the_pages_workflow_builds_with_make_book_and_deploys_the_html(pages):
    build, deploy = pages["jobs"]["build"], pages["jobs"]["deploy"]
    assert "make book" in _runs(build)
    upload = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert deploy["needs"] == "build"
    assert "actions/deploy-pages" in _uses(deploy)
    assert {"pages": "write", "id-token": "write"}.items() <= pages["permissions"].items()
    assert "main" in pages["on"]["push"]["branches"]


def test_the_pages_workflow_takes_the_address_from_the_repository_it_runs_in(pages):
    runs = _runs(pages["jobs"]["build"])
    point = next(i for i, run in enumerate(runs) if "tools/set_repository.py" in run)
    assert "${{ github.repository }}" in runs[point]
    assert point < runs.index("make book"), "the address must be set before the build"
    assert not re.search(r"github\.com/attnlib", (WORKFLOWS / "pages.yml").read_text()), "no address baked in"


def test_the_workflows_call_targets_the_makefile_defines():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for name in ("pages.yml", "test.yml"):
        for job in _load(name)["jobs"].values():
            for run in _runs(job):
                for target in re.findall(r"\bmake ([a-z][a-z-]*)", run):
                    assert target in targets, f"{name} calls make {target}, which the Makefile lacks"


def test_set_repository_rewrites_only_the_address_and_branch():
    from tools.set_repository import set_key

    config = (ROOT / "_config.yml").read_text()
    forked = set_key(set_key(config, "url", "https://github.com/someone/fork"), "branch", "trunk")
    loaded = yaml.safe_load(forked)
    assert loaded["repository"]["url"] == "https://github.com/someone/fork"
    assert loaded["repository"]["branch"] == "trunk"
    original = yaml.safe_load(config)
    assert {k: v for k, v in loaded.items() if k != "repository"} == {
        k: v for k, v in original.items() if k != "repository"}
    assert len(forked.splitlines()) == len(config.splitlines())


def test_ci_installs_chromium_and_runs_make_test():
    script = (ROOT / ".ci" / "run").read_text()
    assert "apt-get update" in script and "apt-get install" in script and "chromium" in script
    assert script.rstrip().endswith("make test")
