#!/usr/bin/env python3
"""Mixes JSONL files into one, shuffled with a seed: training records of several task families in one file.

usage: scripts/mix_jsonl.py --out OUT.jsonl [--seed S] IN.jsonl[:N] ...
Each input contributes all its records, or its first N with IN.jsonl:N (an error if it has fewer). The output is
written atomically; every line must be a JSON object.
"""
import argparse
import json
import os
import random
import sys


def read(spec):
    path, sep, n = spec.rpartition(":")
    if not sep or not n.isdigit():  # no count: the whole spec is the path (which may hold a ':')
        path, n = spec, ""
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except OSError as e:
        sys.exit(f"mix_jsonl: {path}: {e.strerror}")
    for i, line in enumerate(lines, 1):
        try:
            if not isinstance(json.loads(line), dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            sys.exit(f"mix_jsonl: {path}:{i}: {e}")
    if n:
        if int(n) > len(lines):
            sys.exit(f"mix_jsonl: {path}: wants {n} records, has {len(lines)}")
        lines = lines[:int(n)]
    return [line if line.endswith("\n") else line + "\n" for line in lines]


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    lines = [line for spec in a.inputs for line in read(spec)]
    random.Random(a.seed).shuffle(lines)
    with open(a.out + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(a.out + ".tmp", a.out)
    print(f"mix_jsonl: {len(lines)} records from {len(a.inputs)} files to {a.out}")


if __name__ == "__main__":
    main()
