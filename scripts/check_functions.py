#!/usr/bin/env python3
"""Lists C functions longer than a limit (default 120 lines, body included) in the source folders.

A function runs from the first line of its header (a signature may span lines) to its closing brace;
braces at file level that open a struct, enum, union or initializer (generated tables included) are
not functions. Comments and strings are ignored. Exits 1 when any function is over the limit, so CI
keeps functions a reader can hold in their head.
Usage: scripts/check_functions.py [--max N] [DIR ...]
"""
import argparse
import os
import re
import sys

DIRS = ["core", "quant", "lora", "model", "data", "infer", "train", "rl", "switcher_train",
        "verifier_train", "ertrain", "bench"]
NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def strip(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, lines) of every function definition: a top-level { whose header (back to the
    previous ; } or preprocessor line) has a parameter list and no = (initializers) and is not a type."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = strip(f.read()).split("\n")
    depth, start, header = 0, None, []
    for i, line in enumerate(lines):
        if depth == 0 and start is None:
            t = line.strip()
            if not t or t.startswith("#") or t.endswith((";", "}")):
                header = []
            if t and not t.startswith("#"):
                header.append((i, line))
        for c in line:
            if c == "{":
                if depth == 0:
                    text = " ".join(l for _, l in header)
                    m = NAME.search(re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", text))
                    if m and "=" not in text.split("(")[0] and not re.match(r"\s*(typedef|struct|enum|union)\b", text):
                        start = (header[0][0], m.group(1))
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    if start is not None:
                        yield start[1], start[0] + 1, i - start[0] + 1
                    start, header = None, []
        if depth == 0 and line.strip().endswith(";"):
            header = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=120)
    ap.add_argument("dirs", nargs="*", default=DIRS)
    a = ap.parse_args()
    over = []
    for d in a.dirs:
        for root, _, files in os.walk(d):
            for name in sorted(files):
                if name.endswith((".c", ".h", ".cu")):
                    path = os.path.join(root, name)
                    over += [(n, path, line, fn) for fn, line, n in functions(path) if n > a.max]
    for n, path, line, fn in sorted(over, reverse=True):
        print(f"{path}:{line}: {fn} is {n} lines (limit {a.max})")
    if over:
        print(f"{len(over)} function(s) over {a.max} lines", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
