"""The documentation stays true: the options page is what `minicomp config --markdown` prints,
and every relative link in the README and docs/ leads to a file of the repository."""

import os
import re

import pytest

from minicomp import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> list[str]:
    docs = os.path.join(ROOT, "docs")
    return [
        "README.md",
        *(f"docs/{name}" for name in sorted(os.listdir(docs)) if name.endswith(".md")),
    ]


def test_the_options_page_lists_every_option_as_minicomp_config_does():
    with open(os.path.join(ROOT, "docs", "options.md"), encoding="utf-8") as f:
        page = f.read()
    assert config.describe(markdown=True).strip() in page, "regenerate: minicomp config --markdown"


@pytest.mark.parametrize("page", _pages())
def test_relative_links_lead_to_files_of_the_repository(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
        assert path.startswith(ROOT + os.sep), f"{page} links outside the repository: {target}"
        assert os.path.exists(path), f"{page} links to a missing file: {target}"
