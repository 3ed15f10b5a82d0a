#!/usr/bin/env python3
"""Fail when a relative Markdown link in the docs points nowhere.

Checks every inline link and image, `[text](target)` and `![alt](target)`,
in README.md, docs/*.md and the repository's other Markdown files (not
target/, vendor/, third_party/ or node_modules/), or only in the files given as
arguments. CONFIG.md and the SDKs' READMEs link into docs/ too, so a
heading renamed there is caught. A relative target must name a file or
directory that exists, and a `#fragment` must be the anchor of a heading (GitHub's spelling: lower case, punctuation dropped,
spaces to hyphens, `-1`, `-2` for repeats) or of an `<a id>`/`<a name>` in
the target file. Links with a scheme (`https:`, `mailto:`) are not
followed. Code blocks and code spans are skipped, so a link written in an
example is not checked.

Before it checks the files it checks itself on a made-up tree, so that a
check that can no longer fail is caught. Standard library only; well under
a second.

Usage: check-doc-links.py [FILE.md ...]   (run from anywhere; paths are
relative to the repository root)
"""

import os
import re
import sys
import tempfile
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) with one level of nested brackets in the text (a link
# around an image or a code span with brackets); the target may be
# <bracketed> and may carry a "title".
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                continue
            yield number, line
        elif match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                and line.strip() == match.group(1):
            fence = None


def slug(heading):
    """GitHub's anchor for a heading's text (before duplicate suffixes)."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LNM":
            kept.append("-" if ch == " " else ch)
    return "".join(kept)


def anchors(text):
    """Every anchor a Markdown file offers: headings and HTML anchors."""
    seen = {}
    found = set()
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        for name in HTML_ANCHOR.findall(line):
            found.add(name)
    return found


def links(text):
    """(line number, target) of every inline link outside code."""
    for number, line in prose_lines(text):
        line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for match in LINK.finditer(line):
            target = match.group(1)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            yield number, target


def check_file(path, root, cache):
    """The broken links of one file, as `file:line: message` strings."""
    problems = []
    text = path.read_text(encoding="utf-8")
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    for number, target in links(text):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, fragment = target.partition("#")
        where = f"{shown}:{number}: ({target})"
        if file_part:
            resolved = (root / file_part.lstrip("/")) if file_part.startswith("/") \
                else (path.parent / unquote(file_part))
            if not resolved.exists():
                problems.append(f"{where}: no such file or directory")
                continue
        else:
            resolved = path
        if not fragment:
            continue
        if resolved.is_dir() or resolved.suffix.lower() not in (".md", ".markdown"):
            problems.append(f"{where}: an anchor into {resolved.name}, which is not a Markdown file")
            continue
        key = resolved.resolve()
        if key not in cache:
            cache[key] = anchors(resolved.read_text(encoding="utf-8"))
        if unquote(fragment).lower() not in cache[key]:
            problems.append(f"{where}: no heading with the anchor #{fragment} in {resolved.name}")
    return problems


def self_test():
    """The check on a made-up tree: each kind of breakage must be found."""
    assert slug("Request ids and Server-Timing") == "request-ids-and-server-timing"
    assert slug("Security: defaults and limits") == "security-defaults-and-limits"
    assert slug("`inlay admin` and the `[cluster]` table") == "inlay-admin-and-the-cluster-table"
    assert slug("Build (C, Python)") == "build-c-python"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "docs" / "page.md").write_text(
            "# Page\n\n## Some topic\n\n## Some topic\n\n```sh\n# not a heading\n```\n"
            "<a id=\"custom\"></a>\n", encoding="utf-8")
        (root / "README.md").write_text(
            "# Top\n\n"
            "[ok](docs/page.md) [ok](docs/page.md#some-topic) [ok](docs/page.md#some-topic-1)\n"
            "[ok](docs/page.md#custom) [ok](#top) [ok](docs) [ok](https://example.com/x#y)\n"
            "`[code](nowhere.md)` [ok](<docs/page.md> \"title\")\n"
            "```\n[in a block](nowhere.md)\n```\n"
            "[bad](docs/missing.md)\n"
            "[bad](docs/page.md#not-a-heading)\n"
            "[bad](#nowhere)\n"
            "[bad](docs/page.md#some-topic-2)\n"
            "[bad](docs#x)\n", encoding="utf-8")
        problems = check_file(root / "README.md", root, {})
        found = [p.split("(")[1].split(")")[0] for p in problems]
        assert found == ["docs/missing.md", "docs/page.md#not-a-heading", "#nowhere",
                         "docs/page.md#some-topic-2", "docs#x"], problems


def markdown_files(root):
    """README.md, docs/*.md, and every other Markdown file of the repository
    (CONFIG.md, the SDKs' and the load tests' READMEs link into docs/ too);
    build output, vendored code and dependencies are left out."""
    skip = {"target", "vendor", "third_party", "node_modules", "__pycache__"}
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in skip and not d.startswith("."))
        found.extend(os.path.relpath(os.path.join(directory, f), root)
                     for f in sorted(files) if f.endswith(".md"))
    return found


def main(argv):
    self_test()
    names = argv[1:] or markdown_files(ROOT)
    cache = {}
    problems = []
    for name in names:
        path = Path(name) if os.path.isabs(name) else ROOT / name
        if not path.is_file():
            problems.append(f"{name}: no such file")
            continue
        problems.extend(check_file(path, ROOT, cache))
    for problem in problems:
        print(f"check-doc-links: {problem}", file=sys.stderr)
    if problems:
        print(f"check-doc-links: {len(problems)} broken link(s) in {len(names)} file(s)", file=sys.stderr)
        return 1
    print(f"check-doc-links: ok ({len(names)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
