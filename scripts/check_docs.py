#!/usr/bin/env python3
"""Checks the documents a reader follows: every relative link in README.md and docs/*.md points to a file that
exists (and, with a #fragment, to a heading of that file), no document points outside the repository, and the
README stays a front door (at most 250 lines). Prints one line per problem and exits 1 if there is any.
    python3 scripts/check_docs.py        (from anywhere; checks the checkout this script is in)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*```")


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    inside = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                inside = not inside
                continue
            if not inside:
                yield n, line


def anchors(path):
    return {slug(line.lstrip("#")) for _, line in prose_lines(path) if line.startswith("#")}


def check(path, problems):
    rel = os.path.relpath(path, ROOT)
    for n, line in prose_lines(path):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not dest.startswith(ROOT + os.sep) and dest != ROOT:
                problems.append(f"{rel}:{n}: link {target} points outside the repository")
            elif not os.path.exists(dest):
                problems.append(f"{rel}:{n}: link {target}: no such file")
            elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
                problems.append(f"{rel}:{n}: link {target}: no heading #{fragment} in {os.path.relpath(dest, ROOT)}")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if "../shared" in line or "shared/DESIGN" in line:
                problems.append(f"{rel}:{n}: refers to ../shared, which users do not have (the design is docs/design.md)")


def main():
    docs = os.path.join(ROOT, "docs")
    paths = [os.path.join(ROOT, "README.md")]
    paths += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    problems = []
    for path in paths:
        check(path, problems)
    with open(paths[0], encoding="utf-8") as f:
        n = sum(1 for _ in f)
    if n > README_MAX_LINES:
        problems.append(f"README.md: {n} lines, over {README_MAX_LINES}: move the detail into docs/")
    for p in problems:
        print(f"check_docs: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_docs: {len(paths)} documents, every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
