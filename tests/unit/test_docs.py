"""The README is a short front door and the docs hold together: size, table of contents, links that
resolve (files and GitHub heading anchors), every docs page reachable from docs/index.md, and the
install block CI reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT = 20_000

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a code block is not a heading, a link
    there is text)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, punctuation other than '-' and
    '_' dropped, each space a '-'."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading.strip())
    # a link in a heading renders as its text
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    """The link targets of the prose (code spans and fenced blocks excluded)."""
    found = []
    for line in prose_lines(text):
        found += _LINK.findall(_CODE_SPAN.sub("", line))
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or whose ``#anchor`` in that file, does not
    exist."""
    bad = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{page.name}: {target} (no such heading)")
    return bad


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_slug_follows_githubs_rules():
    assert slug("Run on a hub model (Qwen2.5)") == "run-on-a-hub-model-qwen25"
    assert (
        slug("The environments (`envs/`, Gymnasium only)") == "the-environments-envs-gymnasium-only"
    )
    assert slug("Measured: what each setting achieved") == "measured-what-each-setting-achieved"
    assert slug("LoRA and QLoRA on one 24 GB GPU") == "lora-and-qlora-on-one-24-gb-gpu"
    assert slug("[docs](docs/index.md) and `x_y`") == "docs-and-x_y"
    # the fenced '# A' is code
    assert anchors("# A\n## A\n```bash\n# A\n```\n### A!\n") == {"a", "a-1", "a-2"}


def test_broken_links_are_found(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## Part two\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md) [ok](b.md#part-two) [web](https://example.com) `[code](nope.md)`\n"
        "[gone](missing.md) [bad anchor](b.md#part-three) [self](#here)\n```\n[fenced](nope.md)\n```\n"
    )
    assert broken_links(page) == [
        "a.md: missing.md (no such file)",
        "a.md: b.md#part-three (no such heading)",
        "a.md: #here (no such heading)",
    ]


def test_readme_is_a_short_front_door():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, (
        f"README.md is {size} bytes; move reference material to docs/ (limit {README_LIMIT})"
    )


def test_readme_has_a_table_of_contents():
    text = README.read_text()
    m = re.search(r"^## Contents\n\n((?:- \[.*\n)+)", text, re.MULTILINE)
    assert m, "README.md needs a '## Contents' section: a list of links"
    entries = links(m.group(1))
    assert len(entries) >= 10
    own = anchors(text)
    for target in entries:
        assert target.startswith("docs/") or target.lstrip("#") in own, target


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_the_index():
    index = DOCS / "index.md"
    linked = {
        (DOCS / t.partition("#")[0]).resolve()
        for t in links(index.read_text())
        if t.partition("#")[0]
    }
    missing = sorted(p.name for p in DOCS.glob("*.md") if p != index and p.resolve() not in linked)
    assert missing == [], f"docs/index.md does not link {missing}"
    assert "docs/index.md" in links(README.read_text())


def test_readme_links_the_topic_pages():
    targets = {t.partition("#")[0] for t in links(README.read_text())}
    for name in (
        "install",
        "hub-models",
        "lora",
        "memory",
        "multi-gpu",
        "vllm",
        "evaluation",
        "diagnostics",
        "environments",
        "extending",
        "algorithms",
        "learning",
    ):
        assert f"docs/{name}.md" in targets, name


def test_readme_first_bash_block_is_the_two_ci_lines():
    """.ci/run reads the first two lines after the first ```bash fence: the install line and the
    test command."""
    block = (
        re.search(r"^```bash\n(.*?)\n```", README.read_text(), re.DOTALL | re.MULTILINE)
        .group(1)
        .splitlines()
    )
    assert len(block) == 2
    assert block[0].startswith("apt-get update") and block[0].endswith(
        "python main.py fit --config configs/sokoban.yaml"
    )
    assert block[1] == "python -m pytest -q"


# a measured rate or gain (the docs quote three decimals), its sign kept; in a range "0.414-0.508"
# the "-" is no sign
_FIGURE = re.compile(r"(?<![\w.])[+-]?\d+\.\d{3}(?!\d)")


def section(text: str, heading: str) -> str:
    """The body of the heading named ``heading`` (any level) up to the next heading of the same or a
    higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.MULTILINE)
    assert m, f"no heading {heading!r}"
    end = re.compile(rf"^#{{1,{len(m.group(1))}}} ", re.MULTILINE).search(text, m.end())
    return text[m.end() : end.start() if end else len(text)]


def figures(text: str) -> list[str]:
    """The three-decimal figures of ``text``, signs kept (``+0.155``, ``0.277``)."""
    return _FIGURE.findall(text)


def quoted_in(figure: str, text: str) -> bool:
    """Whether ``figure`` appears in ``text`` as a whole figure: ``0.155`` is not in ``+0.155`` nor
    in ``0.1550``."""
    return re.search(rf"(?<![\w.+-]){re.escape(figure)}(?!\d)", text) is not None


def test_figures_are_parsed_and_matched_whole():
    assert figures("from 0.312 to 0.414-0.508, +0.155 [+0.123, -0.008]; 1.1M, ±0.04, 22.2 min") == [
        "0.312",
        "0.414",
        "0.508",
        "+0.155",
        "+0.123",
        "-0.008",
    ]
    assert quoted_in("+0.155", "| +0.155 [+0.123, +0.187] |") and quoted_in(
        "0.403", "0.433, 0.403, 0.447"
    )
    assert (
        not quoted_in("0.155", "+0.155")
        and not quoted_in("0.312", "0.3125")
        and not quoted_in("+0.155", "0.155")
    )
    assert section("# A\nx\n## B\ny 1.000\n### C\nz\n## D\nw\n", "B") == "\ny 1.000\n### C\nz\n"


def test_readme_default_run_figures_are_in_the_learning_table():
    """Every figure the README quotes for the default run (its "What the default run does" section
    and the ``configs/sokoban.yaml`` line of its results) is a figure of docs/learning.md's table of
    the shipped recipes."""
    readme = README.read_text()
    quoted = figures(section(readme, "What the default run does"))
    quoted += figures(
        next(
            line
            for line in section(readme, "Results").split("\n- ")
            if line.startswith("SimpleSokoban (`configs/sokoban.yaml`)")
        )
    )
    assert len(quoted) >= 10, quoted  # the section still quotes its results
    table = "\n".join(
        line
        for line in section(
            (DOCS / "learning.md").read_text(), "The recipes as shipped"
        ).splitlines()
        if line.startswith("|")
    )
    missing = [f for f in quoted if not quoted_in(f, table)]
    assert missing == [], (
        f"README quotes {missing} for the default run; docs/learning.md's table does not"
    )


def test_docs_and_configs_cite_no_missing_spec_file():
    """The repository has no SPEC file: docs, config comments and docstrings cite RAGEN (its files)
    or the papers instead."""
    code = [
        p
        for d in ("ragen_lightning", "envs", "callbacks", "benchmarks", "scripts")
        for p in (ROOT / d).rglob("*.py")
    ]
    files = [README, *DOCS.glob("*.md"), *(ROOT / "configs").rglob("*.yaml"), *code]
    citing = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bSPEC\b|SPEC\.md", line)
    ]
    assert citing == []


_NOT_PROSE = re.compile(r"^(\s{4}|\s*[|#!<>]|\s*[-*+] |\s*\d+\. |\[\^)")
_SENTENCE_END = re.compile(r"""[.:;!?)`*'"]$""")


def cut_off_paragraphs(text: str) -> list[str]:
    """The last lines of prose paragraphs that stop mid-sentence: no closing punctuation, and what
    follows is not the code block, list or table the line introduces (a heading, another paragraph,
    the end of the page)."""
    lines = text.splitlines()
    found, fenced = [], False
    for n, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if (
            fenced
            or not line.strip()
            or _NOT_PROSE.match(line)
            or _SENTENCE_END.search(line.rstrip())
        ):
            continue
        if n + 1 < len(lines) and lines[n + 1].strip():
            continue  # the paragraph goes on
        after = next((x for x in lines[n + 1 :] if x.strip()), "")
        if after and (
            _FENCE.match(after) or re.match(r"^(\s{4}|\s*[-*+] |\s*\d+\. |\s*\|)", after)
        ):
            continue  # introduces a block: "Run it:" may also be "it" + a numbered list
        found.append(line.strip()[-60:])
    return found


def test_cut_off_sentences_are_found():
    text = "Para one ends well.\n\nIt keeps the caches (kept between runs so\n\n## Next\n\nIntro to a list\n\n1. item\n\nlast"
    assert cut_off_paragraphs(text) == ["It keeps the caches (kept between runs so", "last"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_no_sentence_is_cut_off(page):
    assert cut_off_paragraphs(page.read_text()) == []
