"""The documentation's own links: every relative link names a file of the tree, every ``#anchor`` a heading.

The pages are read on GitHub and on the docs site (`mkdocs.yml`), whose anchors differ where a heading
has a run of separators (``--``, `` / ``): a link must name a heading both give the same anchor.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``[text](target)``, the target up to the first space or closing parenthesis
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, each space a hyphen (runs kept)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def site_slug(heading: str) -> str:
    """The docs site's anchor: python-markdown's ``toc`` extension, as `mkdocs.yml` configures it."""
    return slugify(heading.replace("`", ""), "-")


def anchors(page: Path) -> set[str]:
    """The anchors that both GitHub and the docs site give ``page``'s headings (a repeated heading: neither)."""
    headings = re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M)
    both = {h: github_slug(h) for h in headings if github_slug(h) == site_slug(h)}
    unique = [h for h in both if headings.count(h) == 1]  # the two number repeats differently (-1, _1)
    return {both[h] for h in unique}


def test_the_two_slug_rules_differ_on_runs_of_separators_only():
    heading = "Serving: `specprefill serve --engine vllm`"
    assert github_slug(heading) == "serving-specprefill-serve---engine-vllm"
    assert site_slug(heading) == "serving-specprefill-serve-engine-vllm"
    assert (
        github_slug("A run: Qwen2.5-32B's draft")
        == site_slug("A run: Qwen2.5-32B's draft")
        == "a-run-qwen25-32bs-draft"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_a_heading_of_it(page: Path):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with this anchor on both GitHub and the site")
    assert not broken, broken
