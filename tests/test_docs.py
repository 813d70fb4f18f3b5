"""The docs a reader follows: README.md stays a short front page, and every relative link in
it and in docs/ leads to a file (and a heading) that exists."""

import enum
import re
import typing
from pathlib import Path

from pydantic import BaseModel

from bench import summary
from gateway.policy.schema import Policy
from gateway.policy.settings import DEFAULT_MAX_CONCURRENT

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


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def test_every_policy_key_is_documented() -> None:
    """A key added to the schema without a line in docs/policies.md's table fails here."""
    table = (ROOT / "docs" / "policies.md").read_text()
    assert {key for key in _policy_defaults(Policy) if f"`{key}`" not in table} == set()


# Defaults the settings apply when a key is unset (the schema's own default is None).
APPLIED_DEFAULTS = {"limits.default.max_concurrent": f"`{DEFAULT_MAX_CONCURRENT}`"}
TABLE_ROW = re.compile(r"^\| `([^`]+)` \| [^|]* \| (.*) \|$", flags=re.M)


def _spelled(default: object) -> str:
    if default is None:
        return "unset"
    return f"`{default.value if isinstance(default, enum.Enum) else default}`"


def _policy_defaults(
    model: type[BaseModel], prefix: str = "", seen: set | None = None
) -> dict[str, str]:
    """Every leaf key of the policy schema and its default, spelled as docs/policies.md's
    table spells them: a section used twice (`limits.default`, `limits.tenants.<name>`) is
    listed where it first appears."""
    seen = set() if seen is None else seen
    defaults: dict[str, str] = {}
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        subs = _models_in(field.annotation)
        if not subs:
            required = field.is_required()
            default = None if required else field.get_default(call_default_factory=True)
            defaults[path] = "required" if required else _spelled(default)
        origin = typing.get_origin(field.annotation)
        tail = "[]." if origin is list else ".<name>." if origin is dict else "."
        for sub in subs:
            if sub not in seen:
                seen.add(sub)
                defaults |= _policy_defaults(sub, path + tail, seen)
    return defaults


def test_every_documented_default_is_the_schemas() -> None:
    """A default changed in the schema but not in docs/policies.md's table fails here (the
    table once kept `cache.verifier: strict` after the schema moved to `balanced`)."""
    cells = dict(TABLE_ROW.findall((ROOT / "docs" / "policies.md").read_text()))
    wrong = {}
    for key, default in (_policy_defaults(Policy) | APPLIED_DEFAULTS).items():
        cell = cells.get(key, "")
        if not (cell.startswith(default) or (default == "unset" and "(unset)" in cell)):
            wrong[key] = f"schema {default}, docs {cell or 'no row'}"
    assert wrong == {}
