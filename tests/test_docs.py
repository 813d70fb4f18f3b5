"""The docs a reader follows: README.md stays a short front page, and every relative link in
it and in docs/ leads to a file (and a heading) that exists."""

import re
from pathlib import Path

from bench import summary

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:")


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation gone, spaces dashed."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    return broken


def test_readme_is_a_front_page() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


def test_every_relative_link_resolves() -> None:
    broken = {str(page.relative_to(ROOT)): bad for page in _pages() if (bad := _broken_links(page))}
    assert broken == {}, "links to files or headings that do not exist"


def test_readme_links_every_guide() -> None:
    """A guide nobody links to is a guide nobody finds."""
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"(docs/{p.name}" not in readme]
    assert unlinked == []


def test_benchmarks_page_is_generated_from_the_kept_results() -> None:
    """docs/benchmarks.md is `python -m bench.summary`'s output for the committed JSON: a
    figure typed into it by hand, or a result kept without regenerating it, fails here."""
    assert list(summary.REPORTS_DIR.glob("????-??-??/*.json")), "no dated results kept"
    assert summary.PAGE.read_text() == summary.render()
