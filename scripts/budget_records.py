#!/usr/bin/env python3
"""Chains records to SFT conversations whose system line states a token budget, as GRPO's prompts do.

usage: scripts/budget_records.py IN.jsonl OUT.jsonl [--key verbose[@B][:W],...] [--budgets 32,64,128] [--seed 1]
                                 [--template "Think for at most {budget} tokens."] [--where system|user]
Each output record is {"messages": [system, user, assistant], "budget"} plus the record's other fields
(answer, steps, needs_reasoning); the
budget is drawn per record from --budgets with a seeded RNG and stated by --template, in its own
system message or (--where user) at the end of the user message, as `ertrain grpo --budget-in`.
--key none writes prompts only (evaluation records). The response is the record's --key
completion (direct, terse, concise, verbose) whatever the budget, its thinking closed before its answer line
("...\n</think>\n\nAnswer: 5"; a direct one closes an empty think block: "</think>\n\nAnswer: 5"): the adapter
starts inside the think block its reasoning prefix opens, and a response is graded on the answer after the
block closes (data/grade.h). The SFT adapter learns the trace format, GRPO then learns the budget.
Several keys with weights (verbose:96,concise:2,direct:2) draw each record's completion from them, seeded,
so the adapter also holds the shorter forms GRPO can choose between. A key with @B is drawn only for records
whose budget is B (terse@32:4,concise@64:4,concise@128:4,direct:2,verbose:94: the short form of each budget),
so each short form is tied to the budget it serves; each record's budget is drawn first, then its key among
those that apply. The key fit is the longest short form that fits the record's budget in tokens: concise,
else terse, else direct, by the record's "tokens" lengths (written by ertrain synth chains --tokenizer), so
fit@64 gives the terse trace to chains whose concise trace is longer than 64 tokens.
"""
import argparse
import json
import os
import random
import sys


def close_think(response):
    """The chain's thinking closed before its last answer line: "...\nAnswer: 5" -> "...\n</think>\n\nAnswer: 5"."""
    head, sep, tail = response.rpartition("Answer: ")
    if not sep:
        return response + "\n</think>"
    return f"{head}</think>\n\n{sep}{tail}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--key", default="verbose")
    ap.add_argument("--budgets", default="32,64,128")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--template", default="Think for at most {budget} tokens.")
    ap.add_argument("--where", choices=("system", "user"), default="system")
    a = ap.parse_args()
    budgets = [int(x) for x in a.budgets.split(",")]
    try:  # (key, budget it is tied to or None, weight)
        keys = [(k, int(b) if b else None, float(w or 1))
                for kb, _, w in (e.partition(":") for e in a.key.split(",")) for k, _, b in [kb.partition("@")]]
    except ValueError:
        sys.exit(f"budget_records: --key {a.key}: expected KEY or KEY[@BUDGET]:WEIGHT,...")
    if any(w <= 0 for _, _, w in keys) or (len(keys) > 1 and any(k == "none" for k, _, _ in keys)):
        sys.exit(f"budget_records: --key {a.key}: weights must be > 0, and none stands alone")
    keys_at = {b: [(k, w) for k, kb, w in keys if kb in (None, b)] for b in budgets}
    if any(kb is not None and kb not in budgets for _, kb, _ in keys) or not all(keys_at.values()):
        sys.exit(f"budget_records: --key {a.key}: every @BUDGET must be one of --budgets {a.budgets}, "
                 "and every budget needs a key")
    rng = random.Random(a.seed)
    n = 0
    with open(a.src) as f, open(a.dst + ".tmp", "w") as g:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            key = None
            try:
                r = json.loads(line)
                b = rng.choice(budgets)
                # One key: no draw, so the budgets stay those of a single-key run.
                ks = keys_at[b]
                key = ks[0][0] if len(keys) == 1 else rng.choices([k for k, _ in ks], [w for _, w in ks])[0]
                if key == "fit":
                    key = next((k for k in ("concise", "terse") if r["tokens"][k] <= b), "direct")
                problem, response = r["problem"], None if key == "none" else r[key]
            except (ValueError, KeyError, TypeError) as e:
                if key == "fit" and isinstance(e, KeyError):
                    e = f"no token length {e} for fit (records from ertrain synth chains --tokenizer have them)"
                os.remove(a.dst + ".tmp")
                sys.exit(f"budget_records: {a.src}:{i}: {e}")
            line = a.template.format(budget=b)
            if a.where == "system":
                msgs = [{"role": "system", "content": line}, {"role": "user", "content": problem}]
            else:
                msgs = [{"role": "user", "content": f"{problem} {line}"}]
            if response is not None:
                msgs.append({"role": "assistant", "content": close_think(response)})
            # The record's other fields (answer, steps, needs_reasoning, ...) travel with it.
            rest = {k: v for k, v in r.items()
                    if k not in ("problem", "direct", "terse", "concise", "verbose", "tokens")}
            g.write(json.dumps({"messages": msgs, **rest, "budget": b}) + "\n")
            n += 1
    os.replace(a.dst + ".tmp", a.dst)
    what = "prompts only" if a.key == "none" else f"{a.key} responses"
    print(f"budget_records: {n} conversations ({what}, budgets {a.budgets}, stated in the {a.where} turn) to {a.dst}")


if __name__ == "__main__":
    main()
