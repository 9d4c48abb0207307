"""Every test file runs in CI: `.ci/run` calls make targets whose pytest invocations, taken
together, collect every `tests/**/test_*.py` (a folder pytest skips by default, such as `dist`,
or a marker no target selects, would silently drop a file)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ci_targets() -> list[str]:
    return re.findall(r"^\s*make\s+([\w-]+)\s*$", (REPO / ".ci" / "run").read_text(), re.M)


def pytest_arguments(target: str) -> list[list[str]]:
    """The pytest arguments of each `-m pytest` line in the target's recipe (workers dropped)."""
    recipe = re.search(
        rf"^{re.escape(target)}:.*\n((?:\t.*\n)*)", (REPO / "Makefile").read_text(), re.M
    )
    assert recipe, f"Makefile has no target {target!r}, which .ci/run calls"
    invocations = []
    for line in recipe.group(1).splitlines():
        if "-m pytest" in line:
            args = shlex.split(line.split("-m pytest", 1)[1])
            while "-n" in args:
                i = args.index("-n")
                del args[i : i + 2]
            invocations.append(args)
    return invocations


def collected_files(args: list[str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (
        f"pytest {' '.join(args)} cannot collect:\n{out.stdout[-3000:]}{out.stderr[-2000:]}"
    )
    # "-q" lists node ids (path::test), "-qq" counts per file (path: N)
    return {
        re.split(r"::|: ", line, maxsplit=1)[0]
        for line in out.stdout.splitlines()
        if line.startswith("tests/")
    }


def test_every_test_file_is_collected_by_a_ci_target():
    invocations = [args for target in ci_targets() for args in pytest_arguments(target)]
    assert invocations, ".ci/run runs no pytest target"
    collected = set().union(*(collected_files(args) for args in invocations))
    every = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py")}
    missing = sorted(every - collected)
    assert not missing, f"never run by .ci/run ({', '.join(ci_targets())}): {missing}"
