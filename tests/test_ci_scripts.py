"""The shell scripts CI runs cannot fail by a timing race.

Under ``set -o pipefail`` a pipeline into a reader that stops early
(``grep -q``, ``grep -m``, ``head``) fails whenever the reader exits before the
producer has written everything: the producer dies of SIGPIPE (exit 141) and
the pipeline reports it. Whether that happens depends on scheduling, so such a
line passes on one machine and fails a landing on another.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob(".ci/*.sh"), ROOT / ".ci" / "run", *ROOT.glob("tools/*.sh")])

# A pipe into head, or into a grep with -q/--quiet/-m (alone or among
# bundled short options such as -Eq).
EARLY_EXIT_READER = re.compile(
    r"\|\s*(head\b|grep\b[^|;&]*?\s(-[A-Za-z]*[qm][A-Za-z]*\b|--quiet\b|--max-count\b))"
)


def logical_lines(text):
    """The script's lines with backslash continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    for number, line in enumerate(joined.splitlines(), 1):
        code = line.split(" #", 1)[0]
        if not code.lstrip().startswith("#"):
            yield number, code


def early_exit_pipes(text):
    if "pipefail" not in text:
        return []
    return [f"{n}: {line.strip()}" for n, line in logical_lines(text) if EARLY_EXIT_READER.search(line)]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_early_exit_reader_under_pipefail(script):
    assert early_exit_pipes(script.read_text()) == []


@pytest.mark.parametrize(
    "line",
    [
        'unzip -l "$wheel" | grep -q "detgrid/_C.*\\.so"',
        'grep -E -A 30 "$r" "$log" | head -n 120 >&2',
        "cmd | grep -Eq pattern",
        "cmd | grep -m 1 pattern",
        "cmd | grep --quiet x",
    ],
)
def test_detector_finds_the_racing_shapes(line):
    assert early_exit_pipes(f"set -euo pipefail\n{line}\n") != []


@pytest.mark.parametrize(
    "line",
    [
        'grep -q "x" "$work/file"',
        "cmd | grep -v x",
        'cmd | sed -n -E "s/a/b/p"',
        "cmd 2>&1 | tee log",
    ],
)
def test_detector_passes_readers_that_read_everything(line):
    assert early_exit_pipes(f"set -euo pipefail\n{line}\n") == []
