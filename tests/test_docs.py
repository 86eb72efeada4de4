"""The README's links into the manual resolve.

`make docs` (part of `make test`) builds docs/ with `mkdocs build --strict`, whose `validation:` settings in
mkdocs.yml fail the build on a link or anchor inside the docs that leads nowhere, or on a page left out of the
nav. The README lies outside the site, so its links are checked here: each relative link names a file of the
repository, and an anchor into a docs page names one of that page's headings, slugged as mkdocs' `toc`
extension slugs it (Python-Markdown's `markdown.extensions.toc.slugify`, mkdocs' default).
"""

from __future__ import annotations

import re
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parent.parent

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _outside_fences(text: str) -> str:
    """The text with fenced code blocks removed (a `# comment` there is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _outside_code(text: str) -> str:
    """The text with fenced code blocks and inline code removed (a `[x](y)` there is not a link)."""
    return re.sub(r"`[^`\n]*`", "", _outside_fences(text))


def _heading_slugs(page: Path) -> set[str]:
    slugs = set()
    for line in _outside_fences(page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
            slugs.add(slugify(title, "-"))
    return slugs


def _relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_outside_code(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_heading_slugs_as_mkdocs_makes_them():
    """Hand-worked slugs: lower case, punctuation and backticks dropped, spaces as hyphens."""
    page = ROOT / "docs" / "methods.md"
    slugs = _heading_slugs(page)
    assert "derived-profiles-where-each-gpus-time-goes" in slugs
    assert "hacks-prefill-attention" in slugs
    assert "outputs-of-simulate-out-dir" in _heading_slugs(ROOT / "docs" / "usage.md")


def test_readme_links_resolve():
    links = _relative_links(ROOT / "README.md")
    assert any(t.startswith("docs/") for t in links), "the README points into the manual"
    for target in links:
        path, _, anchor = target.partition("#")
        file = (ROOT / path).resolve() if path else ROOT / "README.md"
        assert file.is_file(), f"README links to {target}: no such file"
        assert file.is_relative_to(ROOT), f"README links outside the repository: {target}"
        if anchor:
            assert file.suffix == ".md", f"README links to an anchor in a non-Markdown file: {target}"
            assert anchor in _heading_slugs(file), f"README links to {target}: no heading of {path} has that slug"


def test_every_docs_page_is_linked_from_the_readme():
    """The README's reading list covers the whole manual (the nav's pages, bar the home page)."""
    linked = {Path(t.partition("#")[0]).name for t in _relative_links(ROOT / "README.md") if t.startswith("docs/")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs pages the README does not point to: {sorted(pages - linked)}"
