#!/usr/bin/env python3
"""Lists C functions longer than a limit (default 120 lines, body included) in the source folders.

A function is a line at column 0 that ends in "{" and is not a struct, enum, union or initializer,
up to the next "}" at column 0. Generated tables are not functions and are not counted. Exits 1
when any function is over the limit, so CI keeps functions a reader can hold in their head.
Usage: scripts/check_functions.py [--max N] [DIR ...]
"""
import argparse
import os
import re
import sys

DIRS = ["core", "quant", "lora", "model", "data", "infer", "train", "rl", "switcher_train",
        "verifier_train", "ertrain", "bench"]
START = re.compile(r"^[A-Za-z_][^;=]*\)\s*(__attribute__\(\(.*\)\)\s*)?\{\s*$")
NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def functions(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    start = None
    for i, line in enumerate(lines):
        if start is None:
            if START.match(line) and not re.match(r"^(typedef|struct|enum|union|static const|const)\b", line):
                m = NAME.search(line)
                start = (i, m.group(1) if m else "?")
        elif line.startswith("}"):
            yield start[1], start[0] + 1, i - start[0] + 1
            start = None


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
