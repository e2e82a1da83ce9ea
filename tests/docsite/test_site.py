"""The site builds strictly (mkdocs.yml: a broken link or anchor, or a page outside the nav, is
an error), in process and in about a second; the README stays short and its links into docs/
reach pages that exist."""

from __future__ import annotations

import re
import shutil

import pytest
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

from .pages import DOCS, REPO

README = REPO / "README.md"


def build_site(config_file, site_dir) -> None:
    build(load_config(str(config_file), site_dir=str(site_dir), strict=True))


def test_the_site_builds_strictly_and_every_code_block_renders_as_code(tmp_path) -> None:
    build_site(REPO / "mkdocs.yml", tmp_path / "site")
    assert (tmp_path / "site" / "operations" / "membership.html").is_file()
    assert (tmp_path / "site" / "reference" / "cli.html").is_file()
    # A fence inside a list item is not read as one (it shows as a paragraph of text).
    unrendered = []
    for page in DOCS.rglob("*.md"):
        fences = len(re.findall(r"^\s*```", page.read_text(), re.M)) // 2
        html = (tmp_path / "site" / page.relative_to(DOCS)).with_suffix(".html").read_text()
        if html.count("<pre") != fences:
            unrendered.append(f"{page.relative_to(REPO)}: {fences} blocks, "
                              f"{html.count('<pre')} rendered")
    assert unrendered == []


@pytest.mark.parametrize("broken", ["[gone](nowhere.md)", "[gone](concepts/jobs.md#nowhere)"])
def test_a_broken_link_fails_the_build(tmp_path, broken: str) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + f"\n{broken}\n")
    with pytest.raises(Abort):
        build_site(tmp_path / "mkdocs.yml", tmp_path / "site")


def test_every_page_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    pages = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    assert [page for page in pages if f" {page}\n" not in nav] == []


def test_the_readme_is_short_and_its_links_into_docs_exist() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert "make demo" in text and "make test" in text and "## A five-minute tour" in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    into_docs = [link for link in links if link.startswith("docs/")]
    assert len(into_docs) >= 10, links
    assert [link for link in links if not (REPO / link).is_file()
            and not link.startswith(("http://", "https://"))] == []


def test_what_names_a_readme_section_names_one_the_readme_has() -> None:
    """The manual moved into docs/: code, configs and manifests name the page now
    (`docs/operations/size.md, "Sizing the state"`), not a README section that is gone."""
    headings = set(re.findall(r"^#+ (.+)$", README.read_text(), re.M))
    stale = []
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        if (not path.is_file() or parts[0] in {".git", ".venv", "build", "data", "docs"}
                or path.suffix not in {".py", ".yml", ".yaml", ".toml", ".example", ".service",
                                       ".json", ".sh", ""}):
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r'README(?:,|:)?\s+"([^"]+)"', text):
            title = " ".join(match.group(1).split())
            if title not in headings:
                stale.append(f"{path.relative_to(REPO)}: {title}")
    assert stale == []


def test_the_readme_tour_is_the_tour_page() -> None:
    """The tour is in both (the README's first steps, the site's getting started): the same
    words, so neither drifts."""
    readme = README.read_text()
    start = readme.index("## A five-minute tour\n") + len("## A five-minute tour\n")
    end = readme.index("\n## ", start)
    page = (DOCS / "getting-started" / "tour.md").read_text()
    body = page.split("\n", 1)[1]
    assert page.startswith("# A five-minute tour\n")
    assert readme[start:end].strip() == body.strip()
