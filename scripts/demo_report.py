#!/usr/bin/env python3
"""The demo's report: reads what scripts/demo.sh wrote into --out and prints, and writes to --results,
the table in the paper's shape, with gnuplot PNGs next to the results file. Every number comes from
the files of that run.

usage: scripts/demo_report.py --out DIR --results FILE.md --budgets 32,64,128 --eval-budget 64
                              [--quick 0|1] [--seconds S]
"""
import argparse
import json
import os
import subprocess
import sys


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def find(obj, key):
    """The first value of `key` anywhere in a JSON object."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            r = find(v, key)
            if r is not None:
                return r
    return None


def roc_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


class Report:
    def __init__(self, a):
        self.a, self.out = a, a.out
        self.lines = []
        self.steps = {i: r["steps"] for i, r in enumerate(jsonl(f"{a.out}/eval.jsonl"), 1)}
        self.fig_dir = os.path.dirname(os.path.abspath(a.results))
        self.fig_prefix = "demo_" if not a.quick else "demo_quick_"

    def p(self, s=""):
        self.lines.append(s)

    def eval_summary(self, name):
        """accuracy, mean generated tokens, accuracy at k >= 4, items of an erinfer eval output."""
        items = jsonl(f"{self.out}/{name}.jsonl")
        acc = sum(bool(r["correct"]) for r in items) / len(items)
        tok = sum(r["samples"][0]["n_tokens"] for r in items) / len(items)
        hard = [bool(r["correct"]) for r in items if self.steps[r["line"]] >= 4]
        return acc, tok, (sum(hard) / len(hard) if hard else float("nan")), len(items)

    def table1(self):
        a, out = self.a, self.out
        budgets = [int(b) for b in a.budgets.split(",")]
        acc, tok, hard, n = self.eval_summary("eval-base")
        self.p(f"### 1. Accuracy and mean generated length ({n} held-out problems, k = 1..8 steps, greedy)")
        self.p()
        self.p("| model | stated budget | accuracy | accuracy k >= 4 | mean tokens | SFT / GRPO length |")
        self.p("|---|---|---|---|---|---|")
        self.p(f"| base, direct answer | {a.eval_budget} | {100 * acc:.1f}% | {100 * hard:.1f}% | {tok:.1f} | |")
        ratios, pareto = [], []
        for b in budgets:
            sa, st, sh, _ = self.eval_summary(f"eval-sft-b{b}")
            ga, gt, gh, _ = self.eval_summary(f"eval-grpo-b{b}")
            ratios.append(st / gt if gt > 0 else float("nan"))
            pareto.append((b, st, sa, gt, ga))
            self.p(f"| masked-LoRA SFT (verbose) | {b} | {100 * sa:.1f}% | {100 * sh:.1f}% | {st:.1f} | |")
            self.p(f"| GRPO (budget-forced) | {b} | {100 * ga:.1f}% | {100 * gh:.1f}% | {gt:.1f} | "
                   f"{ratios[-1]:.2f}x |")
        self.p()
        mono = all(pareto[i][3] <= pareto[i + 1][3] for i in range(len(pareto) - 1))
        self.p(f"GRPO length by stated budget {', '.join(f'{b}: {g:.1f}' for b, _, _, g, _ in pareto)} tokens "
               f"({'monotone' if mono else 'not monotone'} in the budget); mean SFT/GRPO length ratio "
               f"{sum(ratios) / len(ratios):.2f}x.")
        self.p()
        with open(f"{out}/pareto.dat", "w") as f:
            for b, st, sa, gt, ga in pareto:
                f.write(f"{b} {st} {sa} {gt} {ga}\n")
        metrics = jsonl(f"{out}/grpo/metrics.jsonl")
        with open(f"{out}/grpo_curve.dat", "w") as f:
            for m in metrics:
                lb = m.get("length_by_budget", {})
                f.write(f"{m['step']} {m['reward']} {m['length']} " + " ".join(str(lb.get(str(b), "NaN"))
                                                                           for b in budgets) + "\n")
        self.budgets = budgets

    def table2_3(self):
        out = self.out

        def vote_table(log):
            rows = []
            for line in open(log):
                parts = line.split()
                if len(parts) == 6 and parts[0].isdigit():
                    rows.append([int(parts[0])] + [float(x) for x in parts[1:]])
            return rows

        routed = vote_table(f"{out}/pipeline.log")
        always = vote_table(f"{out}/pipeline-always.log")
        self.p(f"### 2. Greedy vs majority vs verifier-weighted vote ({len(jsonl(f'{out}/eval_mix.jsonl'))} problems, "
               "half k = 1, half k = 2..8; GRPO adapter, temperature 0.8, switcher on)")
        self.p()
        self.p("| N | greedy | majority | verifier-weighted | tokens / query |")
        self.p("|---|---|---|---|---|")
        for n, g, mj, w, t, _ in routed:
            self.p(f"| {n} | {100 * g:.1f}% | {100 * mj:.1f}% | {100 * w:.1f}% | {t:.1f} |")
        self.p()
        with open(f"{out}/votes.dat", "w") as f:
            for n, g, mj, w, t, _ in routed:
                f.write(f"{n} {g} {mj} {w}\n")
        heads = {}
        for h in ("switcher", "verifier"):
            with open(f"{out}/heads/{h}.json") as f:
                j = json.load(f)
            heads[h] = (find(j, "val_roc_auc"), find(j, "val_accuracy"))
        items = jsonl(f"{out}/pipeline.jsonl")
        evald = jsonl(f"{out}/eval_mix.jsonl")
        sc = [find(r, "switcher_score") for r in items]
        lab = [bool(evald[r["line"] - 1]["needs_reasoning"]) for r in items]
        auc = roc_auc(sc, lab) if all(s is not None for s in sc) else None
        nr, na = routed[-1], always[-1]
        self.p("### 3. Switcher: route to reasoning only when needed (the same problems)")
        self.p()
        self.p("| | share routed to reasoning | tokens / query | weighted-vote accuracy (N = %d) |" % nr[0])
        self.p("|---|---|---|---|")
        self.p(f"| always reason | 100% | {na[4]:.1f} | {100 * na[3]:.1f}% |")
        self.p(f"| switcher | {100 * nr[5]:.1f}% | {nr[4]:.1f} | {100 * nr[3]:.1f}% |")
        self.p()
        saved = 1 - nr[4] / na[4] if na[4] > 0 else float("nan")
        fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
        self.p(f"Tokens saved by routing: {100 * saved:.1f}%. Switcher ROC-AUC on the evaluation problems "
               f"(label: the record's needs_reasoning, k > 1): {fmt(auc)}; on its own held-out split: {fmt(heads['switcher'][0])}. "
               f"Verifier held-out ROC-AUC: {fmt(heads['verifier'][0])}.")
        self.p()

    def table4(self):
        out = self.out
        self.p("### 4. Quantized bases, each with its QAMR adapter (stated budget %s, greedy)" % self.a.eval_budget)
        self.p()
        self.p("| base | adapter | KV | accuracy | mean tokens | weight bytes | decode tokens/s (1 stream) |")
        self.p("|---|---|---|---|---|---|---|")
        rows = [("fp32", "fp32", "SFT (fp32)", "f32"), ("w4-noqamr", "w4", "SFT (fp32), no QAMR", "int8"),
                ("w4", "w4", "QAMR", "int8"), ("w2", "w2", "QAMR", "int8")]
        names = {"fp32": "fp32", "w4": "W4A16KV8 (q4 per channel, fpt transforms, int8 embeddings)",
                 "w2": "W2 LUT (2-bit k-means codebooks, fpt transforms)"}
        for ev, bench, adapter, kv in rows:
            acc, tok, _, _ = self.eval_summary(f"eval-q-{ev}")
            b = json.load(open(f"{out}/bench-{bench}.json"))
            tps = next(r["tokens_per_s_seq"] for r in b["rows"] if r["kv"] == kv and r["n"] == 1)
            self.p(f"| {names[bench]} | {adapter} | {kv} | {100 * acc:.1f}% | {tok:.1f} | "
                   f"{b['weight_bytes'] / 1e6:.2f} MB | {tps:.0f} |")
        self.p()

    def table5(self):
        out = self.out
        m = json.load(open(f"{out}/bench-fp32.json"))
        u = json.load(open(f"{out}/bench-unmasked.json"))
        ma, ua = m["adapter_after_base_prefill"], u["adapter_after_base_prefill"]
        kv = {r["kv"]: r["kv_bytes"] for r in m["rows"] if r["n"] == 8}
        P = m["prompt_tokens"]
        self.p(f"### 5. Time to first token after the base prefill ({P}-token prompt), and KV memory")
        self.p()
        self.p("| adapter | prompt positions recomputed | TTFT |")
        self.p("|---|---|---|")
        self.p(f"| masked LoRA (prompt KV reused) | {P - ma['prompt_reused']} | {ma['ttft_ms']:.3f} ms |")
        self.p(f"| unmasked LoRA (prompt recomputed with the adapter) | {P - ua['prompt_reused']} | "
               f"{ua['ttft_ms']:.3f} ms |")
        self.p()
        self.p(f"KV cache for 8 samples sharing the prompt ({P} + {m['new_tokens']} positions each): "
               f"fp32 {kv['f32'] / 1024:.0f} KiB, int8 {kv['int8'] / 1024:.0f} KiB "
               f"({kv['int8'] / kv['f32']:.2f}x).")
        self.p()

    def plots(self):
        out, fd, pre = self.out, self.fig_dir, self.fig_prefix
        cols = " ".join(f"'{out}/grpo_curve.dat' using 1:{4 + i} with lines title 'length, B = {b}',"
                        for i, b in enumerate(self.budgets))
        script = f"""
set terminal pngcairo size 760,520
set grid
set output '{fd}/{pre}length_accuracy.png'
set title 'Held-out accuracy vs mean generated length, per stated budget'
set xlabel 'mean generated tokens'; set ylabel 'accuracy'
plot '{out}/pareto.dat' using 2:3:1 with labels point pt 7 offset 1,1 title 'SFT (verbose)', \\
     '{out}/pareto.dat' using 4:5:1 with labels point pt 5 offset 1,-1 title 'GRPO (budget-forced)'
set output '{fd}/{pre}grpo_curves.png'
set title 'GRPO: rollout length per stated budget, and mean reward'
set xlabel 'step'; set ylabel 'tokens'; set y2label 'reward'; set y2tics; set ytics nomirror
plot {cols} '{out}/grpo_curve.dat' using 1:2 axes x1y2 with lines lw 2 title 'reward'
unset y2label; unset y2tics; set ytics mirror
set output '{fd}/{pre}votes.png'
set title 'Accuracy vs samples per query'
set xlabel 'N'; set ylabel 'accuracy'; set logscale x 2
plot '{out}/votes.dat' using 1:2 with linespoints title 'greedy', '' using 1:3 with linespoints title 'majority', \\
     '' using 1:4 with linespoints title 'verifier-weighted'
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
        rel = lambda name: os.path.relpath(f"{fd}/{pre}{name}", os.path.dirname(os.path.abspath(self.a.results)))
        self.p(f"![accuracy vs length]({rel('length_accuracy.png')}) ![GRPO curves]({rel('grpo_curves.png')}) "
               f"![votes]({rel('votes.png')})")
        self.p()

    def write(self):
        a = self.a
        head = [f"# Demo results{' (QUICK=1: wiring check, not quality)' if a.quick else ''}", "",
                f"Made by `make demo{' QUICK=1' if a.quick else ''}` (scripts/demo.sh) in {a.seconds} s; every "
                f"number below comes from that run's files in `{a.out}`.", ""]
        text = "\n".join(head + self.lines) + "\n"
        tmp = a.results + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.results)
        print(text)
        print(f"wrote {a.results}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--budgets", required=True)
    ap.add_argument("--eval-budget", required=True)
    ap.add_argument("--quick", type=int, default=0)
    ap.add_argument("--seconds", type=int, default=0)
    a = ap.parse_args()
    r = Report(a)
    try:
        r.table1()
        r.table2_3()
        r.table4()
        r.table5()
        r.plots()
    except (OSError, KeyError, ValueError, StopIteration) as e:
        sys.exit(f"demo_report: {a.out}: {type(e).__name__}: {e}")
    r.write()


if __name__ == "__main__":
    main()
