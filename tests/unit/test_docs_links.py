"""Every relative link and image in README.md and docs/ resolves: to a file, and for `#anchor`
into a Markdown file to one of its headings (slugged as the site's table of contents slugs them).
`mkdocs build --strict` checks the site's pages the same way; this also covers the README, which
the site does not build."""

from __future__ import annotations

import re
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, …


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def anchors(path: Path) -> set[str]:
    """The heading ids of a Markdown file: the toc extension's slugs, repeats suffixed _1, _2, …"""
    seen: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        text = INLINE_LINK.sub(r"\1", match.group(1)).replace("*", "").replace("`", "")
        base = slug = slugify(text, "-")
        n = 0
        while slug in seen:
            n += 1
            slug = f"{base}_{n}"
        seen.add(slug)
    return seen


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def broken_links(path: Path) -> list[str]:
    """`file:line: target (why)` for each relative link or image of `path` that does not resolve."""
    problems = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{_shown(path)}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no heading #{anchor} in {dest.name})")
    return problems


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_link_of_the_readme_and_docs_resolves():
    files = doc_files()
    assert len(files) > 10, "docs/ holds the site's pages"
    problems = [p for f in files for p in broken_links(f)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with punctuation\n", encoding="utf-8")
    (tmp_path / "pic.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#a-code-heading-with-punctuation) ![fine](pic.png) [web](https://example.org/x)\n"
        "[self](#page) `[in code](missing.md)`\n\n"
        "```\n[in a fence](missing.md)\n```\n"
        "[gone](missing.md) ![gone](img/missing.png)\n"
        "[bad anchor](other.md#no-such-heading) [bad self](#nowhere)\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md (no such file)",
        "img/missing.png (no such file)",
        "other.md#no-such-heading (no heading #no-such-heading in other.md)",
        "#nowhere (no heading #nowhere in page.md)",
    ]
    assert problems[0] == "page.md:9: missing.md (no such file)"  # file and line named


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Runs\n\n## Measured\n\n## Measured\n\n```\n# not a heading\n```\n", encoding="utf-8")
    assert anchors(page) == {"runs", "measured", "measured_1"}
