"""make install runs two pips at once (Makefile, $(STAMP)): torch's half with --no-deps beside the rest
of requirements.txt with its dependencies. That is safe only while the two halves share no package:
nothing the second half installs may need a package of the first, or both pips would install it at
the same time. Checked on the installed environment, whose packages are what the rest resolves to."""

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def makefile_variable(name):
    match = re.search(rf"^{name} := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, f"the Makefile defines no {name}"
    return match.group(1).strip()


def torch_half():
    pattern = makefile_variable("TORCH_REQUIREMENTS").strip("'")
    lines = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if re.match(pattern, line)]
    names = {canonicalize_name(Requirement(line).name) for line in lines}
    return names | {canonicalize_name(name) for name in makefile_variable("TORCH_ONLY").split()}


def requirements_of(distribution):
    """The names of the packages ``distribution`` needs here (markers evaluated, no extras)."""
    needed = set()
    for text in distribution.requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            needed.add(canonicalize_name(requirement.name))
    return needed


def test_the_torch_half_is_torch_triton_and_what_only_torch_needs():
    half = torch_half()
    assert {"torch", "triton", "sympy"} <= half
    torch_needs = requirements_of(metadata.distribution("torch")) | requirements_of(metadata.distribution("sympy"))
    assert half - {"torch", "triton"} <= torch_needs  # nothing but torch's own dependencies


def test_nothing_the_rest_installs_needs_a_package_of_the_torch_half():
    half = torch_half()
    offending = {}
    for distribution in metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        if name in half:
            continue
        shared = requirements_of(distribution) & half
        if shared:
            offending[name] = sorted(shared)
    assert not offending, (
        f"these packages need packages that make install's torch half installs with --no-deps beside them: "
        f"{offending}; move them out of TORCH_ONLY in the Makefile"
    )
