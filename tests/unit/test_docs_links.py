"""The docs' relative links resolve: every Markdown link in README.md and docs/ (perf-notes,
results, the archive, the results folders' SUMMARY.md) names a file or folder of the
checkout, and a `#anchor` names a heading of the target (GitHub's anchors). Every
`docs/results/...` path a doc names in backticks exists, so no doc points at a raw log that
was packed into a folder's raw.tar.xz or removed. CPU only, reads the checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
    + list((ROOT / "docs" / "archive").glob("*.md"))
    + list((ROOT / "docs" / "results").rglob("SUMMARY.md"))
)
FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
RESULTS_PATH = re.compile(r"`(docs/results/[^`\s]*)`")


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks and indented code."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("    "):
            yield number, line


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation dropped (letters, digits, `_`, `-` and
    spaces kept), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if match:
            base = github_anchor(CODE_SPAN.sub(lambda m: m.group(0)[1:-1], match.group(2)))
            count = seen.get(base, 0)
            seen[base] = count + 1
    return {name if n == 0 else f"{name}-{n}" for name, total in seen.items() for n in range(total)}


def relative_links(path: Path):
    for number, line in prose_lines(path.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("code", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                yield number, target


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            broken.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where} (no heading with that anchor)")
    return broken


def missing_results_paths(path: Path) -> list[str]:
    missing = []
    for number, line in prose_lines(path.read_text()):
        for named in RESULTS_PATH.findall(line):
            if "<" in named:  # a pattern such as docs/results/<date>/
                continue
            alternatives = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", named)
            options = (
                [alternatives[1] + alt + alternatives[3] for alt in alternatives[2].split(",")]
                if alternatives
                else [named]
            )
            for option in options:
                if not (ROOT / option).exists() and not list(ROOT.glob(option)):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {option}")
    return missing


def test_the_checked_docs_exist():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/perf-notes.md", "docs/results.md", "docs/benchmarks.md"} <= names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_results_files_exist(path):
    assert missing_results_paths(path) == []


def test_the_checker_finds_a_broken_file_anchor_and_results_path(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## The `x` flag (session 2)\n")
    page = tmp_path / "docs" / "b.md"
    page.write_text(
        "[ok](a.md#the-x-flag-session-2) [ok](#b) [web](https://example.org/x)\n"
        "# B\n"
        "[gone](c.md) [bad anchor](a.md#nope) `[in code](c.md)`\n"
        "`docs/a.md` `docs/results/2026/x.log`\n"
        "```\n[fenced](c.md)\n```\n"
    )
    assert broken_links(page) == [
        "docs/b.md:3: c.md (no such file)",
        "docs/b.md:3: a.md#nope (no heading with that anchor)",
    ]
    assert missing_results_paths(page) == ["docs/b.md:4: docs/results/2026/x.log"]
