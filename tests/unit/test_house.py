"""The house rules, beside the layout's (test_layout.py): modules small enough to read whole, comments
that say why rather than narrate the work's history, the README's parameter table made from the
code, a benchmark suite of a few scripts whose figures docs/benchmarks.md shows as they are now."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from tidepool import parameters as param
from tidepool.testing import REPO_ROOT

MODULE_LINES = 450
SOURCE_FOLDERS = ("tidepool", "tests", "benchmarks", "backend", "loadtests")
BENCHMARK_SCRIPTS = 10
DATED_SECTIONS = 8
# A commit hash: 7 to 40 hex digits with at least one letter and one digit.
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def python_files(root: Path = REPO_ROOT) -> list[Path]:
    return sorted(path for folder in SOURCE_FOLDERS for path in (root / folder).rglob("*.py"))


def oversized(paths: list[Path], limit: int = MODULE_LINES) -> list[str]:
    return [
        f"{path}: {lines} lines" for path in paths if (lines := len(path.read_text().splitlines())) > limit
    ]


def narrated(path: Path) -> list[str]:
    """Commit hashes in a module's comments and docstrings (history belongs in git and the notes)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        is_docstring = token.type == tokenize.STRING and token.string.startswith(('"""', "'''"))
        if token.type == tokenize.COMMENT or is_docstring:
            found += [f"{path}:{token.start[0]}: {match}" for match in COMMIT_HASH.findall(token.string)]
    return found


def test_no_module_is_longer_than_the_limit():
    assert oversized(python_files()) == []


def test_the_size_guard_catches_a_module_one_line_over(tmp_path):
    module = tmp_path / "long.py"
    module.write_text("x = 1\n" * (MODULE_LINES + 1))
    assert oversized([module]) == [f"{module}: {MODULE_LINES + 1} lines"]
    module.write_text("x = 1\n" * MODULE_LINES)
    assert oversized([module]) == []


def test_no_comment_or_docstring_narrates_history_with_a_commit_hash(tmp_path):
    assert [line for path in python_files() for line in narrated(path)] == []
    sample = tmp_path / "sample.py"
    sample.write_text('"""Fast since 3c8d730."""\nx = 0xdeadbeef  # as measured at commit 7bfea82\n')
    assert narrated(sample) == [f"{sample}:1: 3c8d730", f"{sample}:2: 7bfea82"]


def test_the_readme_shows_the_parameter_table_the_code_makes():
    assert param.markdown_table() in (REPO_ROOT / "README.md").read_text(), (
        "README.md's parameter table is not the one tidepool/parameters.py makes: "
        "run .venv/bin/python -m tidepool.parameters README.md"
    )


def test_the_benchmarks_are_a_suite_of_few_scripts_each_shown_in_the_docs():
    scripts = sorted(p for p in (REPO_ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    scripts = [p for p in scripts if p.name != "__init__.py"]
    assert len(scripts) <= BENCHMARK_SCRIPTS, [p.name for p in scripts]
    figures = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    missing = [p.name for p in scripts if p.stem not in figures]
    assert missing == [], f"scripts docs/benchmarks.md does not show: {missing}"
    dated = [
        line for line in figures.splitlines() if line.startswith("#") and re.search(r"\d{4}-\d\d-\d\d", line)
    ]
    assert len(dated) <= DATED_SECTIONS, dated
