"""README's Architecture section matches the engine's tree: every module named, no stale names;
and no Python file of the project passes 400 lines."""

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _architecture_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Architecture\n")
    end = readme.find("\n## ", start + 1)
    return readme[start : end if end != -1 else None]


def test_architecture_table_names_every_engine_module() -> None:
    named = set(re.findall(r"`(engine/[\w/]+\.py)`", _architecture_section()))
    modules = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "engine").rglob("*.py")
        if p.name != "__init__.py" or p.parent.name == "models"
    }
    assert modules - named == set(), "modules missing from README's Architecture table"
    assert named - modules == set(), "README's Architecture table names modules that are gone"


def _project_python_files() -> list[Path]:
    """Every Python file git tracks or would track (not ignored): virtual environments,
    caches and baseline venvs stay out however big they are."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / name for name in sorted(set(listed)) if (ROOT / name).is_file()]


def test_no_source_file_passes_400_lines() -> None:
    """A file does one thing its name says: none of the project's Python files (engine,
    gateway, tests, bench, anything git tracks) passes 400 lines."""
    files = _project_python_files()
    assert ROOT / "tests" / "test_architecture.py" in files  # the listing saw the tree
    long = {
        str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}, "Python files over 400 lines (split each by concern; lines shown)"


def test_architecture_table_line_counts_match_the_tree() -> None:
    """Each module row's `lines` is the `wc -l` of its files: a table that drifts from the
    tree (it once claimed 3,007 lines where there were 3,764) fails here."""
    stale = {}
    for row in _architecture_section().splitlines():
        files = re.findall(r"`(engine/[\w/]+\.py)`", row.split(" | ")[0])
        if not files or not (count := re.search(r"\| ([\d,]+) \|$", row)):
            continue
        actual = sum(len((ROOT / f).read_text().splitlines()) for f in files)
        if int(count.group(1).replace(",", "")) != actual:
            stale[", ".join(files)] = actual
    assert stale == {}, "README Architecture rows whose line count is stale (actual shown)"


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _code_lines(path: Path) -> int:
    """Lines holding code: no blank lines, comments or docstrings."""
    src = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if isinstance(node, _DOCUMENTED) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", 0), str):
                docs.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip | {tokenize.ENDMARKER}:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docs)


def test_architecture_subtotals_and_totals_match_the_rows() -> None:
    """An italic row is the sum of the module rows above it (since the last subtotal), a
    bold row the sum of the subtotals above it: "lines (code lines)", so that the core's
    headline size (issue 14: at most 2,000 lines) is the tree's."""
    group, total, stale = [0, 0], [0, 0], {}
    for row in _architecture_section().splitlines():
        files = re.findall(r"`(engine/[\w/]+\.py)`", row.split(" | ")[0])
        figure = re.search(r"\*+([\d,]+) \(([\d,]+)\)\*+ \|$", row)
        if files and "entrypoints" not in row.split(" | ")[0]:
            group[0] += sum(len((ROOT / f).read_text().splitlines()) for f in files)
            group[1] += sum(_code_lines(ROOT / f) for f in files)
        elif figure and row.startswith("| **"):
            claimed, actual = [int(g.replace(",", "")) for g in figure.groups()], total
        elif figure:
            claimed, actual = [int(g.replace(",", "")) for g in figure.groups()], group
            total, group = [total[0] + group[0], total[1] + group[1]], [0, 0]
        if figure and claimed != actual:
            stale[row.split(" | ")[0]] = tuple(actual)
    assert stale == {}, "README Architecture totals that are stale (actual lines, code lines)"
