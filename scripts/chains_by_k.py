#!/usr/bin/env python3
"""Per-k accuracy and mean generated tokens of `erinfer eval` outputs on a chains file.

usage: scripts/chains_by_k.py DATA.jsonl NAME=EVAL_OUT.jsonl [NAME=EVAL_OUT.jsonl ...]
Each eval output's "line" points back into DATA.jsonl, whose "steps" is k.
"""
import json
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip())
    steps = {i: json.loads(l)["steps"] for i, l in enumerate(open(sys.argv[1]), 1) if l.strip()}
    ks = sorted(set(steps.values()))
    runs = []
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        acc, tok = {}, {}
        for l in open(path):
            r = json.loads(l)
            k = steps[r["line"]]
            acc.setdefault(k, []).append(bool(r["correct"]))
            tok.setdefault(k, []).append(r["samples"][0]["n_tokens"])
        runs.append((name, acc, tok))
    print("| k | n | " + " | ".join(f"{n} acc | {n} tokens" for n, _, _ in runs) + " |")
    print("|---|---|" + "---|---|" * len(runs))
    groups = [(str(k), [k]) for k in ks] + [("1-3", [k for k in ks if k <= 3]), (">=4", [k for k in ks if k >= 4]),
                                            ("all", ks)]
    for label, kk in groups:
        n = sum(len(runs[0][1].get(k, [])) for k in kk)
        cells = []
        for _, acc, tok in runs:
            a = [x for k in kk for x in acc.get(k, [])]
            t = [x for k in kk for x in tok.get(k, [])]
            cells.append(f"{100 * sum(a) / max(len(a), 1):.1f}% | {sum(t) / max(len(t), 1):.1f}")
        print(f"| {label} | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
