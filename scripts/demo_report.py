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


def fmt_auc(x):
    """A ROC-AUC to 3 places; n/a where the heads had only one class to score (none recorded)."""
    return "n/a" if x is None else f"{x:.3f}"


def fmt_acc(x):
    """An accuracy in percent; n/a where none was recorded."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def roc_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def vote_table(log):
    """The rows of an erinfer eval pipeline table: N, greedy, majority, weighted, tokens/query, reasoning share."""
    rows = []
    for line in open(log):
        parts = line.split()
        if len(parts) == 6 and parts[0].isdigit():
            rows.append([int(parts[0])] + [float(x) for x in parts[1:]])
    return rows


def vote_lines(rows, dat_path):
    """The markdown table of vote_table rows; writes them to dat_path for gnuplot_votes."""
    with open(dat_path, "w") as f:
        for n, g, mj, w, t, _ in rows:
            f.write(f"{n} {g} {mj} {w}\n")
    return ["| N | greedy | majority | verifier-weighted | tokens / query |", "|---|---|---|---|---|"] + \
        [f"| {n} | {100 * g:.1f}% | {100 * mj:.1f}% | {100 * w:.1f}% | {t:.1f} |" for n, g, mj, w, t, _ in rows] + [""]


def moving_average(xs, w):
    """Trailing mean over the last w values that are present (None = missing), None before any."""
    out = []
    for i in range(len(xs)):
        win = [x for x in xs[max(0, i - w + 1):i + 1] if x is not None]
        out.append(sum(win) / len(win) if win else None)
    return out


def write_curve(metrics_path, dat_path, budgets):
    """GRPO's per-step reward, rollout accuracy and length per budget as moving averages over a tenth of
    the run (at least 1 step): step, reward, accuracy, length at each budget. Returns the window."""
    metrics = jsonl(metrics_path)
    w = max(1, len(metrics) // 10)
    cols = [[m["reward"] for m in metrics], [m["accuracy"] for m in metrics]]
    cols += [[m.get("length_by_budget", {}).get(str(b)) for m in metrics] for b in budgets]
    cols = [moving_average(c, w) for c in cols]
    with open(dat_path, "w") as f:
        for i, m in enumerate(metrics):
            f.write(f"{m['step']} " + " ".join("NaN" if c[i] is None else f"{c[i]:.6g}" for c in cols) + "\n")
    return w


def padded_bounds(vals, pad=0.12, floor=None, ceil=None, min_span=0.0):
    """(lo, hi) covering every value with a margin of `pad` x the span on both sides, and at least min_span wide
    (so that close values are not drawn across the whole plot)."""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or max(abs(hi), 1e-3)
    lo, hi = lo - pad * span, hi + pad * span
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    return (lo if floor is None else max(floor, lo)), (hi if ceil is None else min(ceil, hi))


def padded_range(vals, pad=0.12, floor=None, ceil=None, min_span=0.0):
    """padded_bounds as a [lo:hi] gnuplot range."""
    lo, hi = padded_bounds(vals, pad, floor, ceil, min_span)
    return f"[{lo:.6g}:{hi:.6g}]"


def spread_labels(ys, gap, top):
    """Heights for the labels of points at heights ys: at their points where those are at least `gap` apart,
    otherwise pushed apart downwards in the points' order, then shifted back so their mean is the points', but
    none above `top` (a label past the plot's edge is not drawn)."""
    lab, prev = [0.0] * len(ys), None
    for i in sorted(range(len(ys)), key=lambda i: -ys[i]):
        lab[i] = ys[i] if prev is None else min(ys[i], prev - gap)
        prev = lab[i]
    shift = min((sum(ys) - sum(lab)) / len(ys), top - max(lab))
    return [v + shift for v in lab]


def gnuplot_curves(dat, png, budgets, window, title):
    """Two panels from a write_curve file: reward and rollout accuracy, then length per stated budget."""
    lens = ", ".join(f"'{dat}' using 1:{4 + i} with lines lw 2 title 'length, B = {b}'" for i, b in enumerate(budgets))
    return f"""
set output '{png}'
unset title
set multiplot layout 2,1 title "{title}\\n(moving averages over {window} steps)"
set xlabel 'step'; set ylabel 'reward / accuracy'; set key outside right top vertical title '{window}-step means'
set lmargin 10; set rmargin 26
plot '{dat}' using 1:2 with lines lw 2 title 'reward', \\
     '' using 1:3 with lines lw 2 title 'rollout accuracy'
set ylabel 'rollout tokens'
plot {lens}
unset multiplot
set key default; set lmargin -1; set rmargin -1
"""


PARETO_SERIES = (("SFT", 1, 7), ("GRPO", 3, 5))


def pareto_plot(path, base_point, yrange, series=PARETO_SERIES):
    """gnuplot commands for a pareto file (budget, then tokens and accuracy of each model per row; series:
    (label, column of its tokens, point type)): the y-axis set to yrange (lo, hi), then one labelled point per
    model and budget, the labels of one model at least a line apart (spread_labels), every other model's on the
    left of its points, so that near-equal points stay readable."""
    rows = [line.split() for line in open(path)]
    gap = 0.035 * (yrange[1] - yrange[0])  # a text line of the 640-pixel-high plot, in accuracy units
    items = [f"'-' using 1:2:('base, direct') with labels point pt 9 ps 2 offset char 1.5,char 0 left notitle"]
    data = [f"{base_point[0]} {base_point[1]}", "e"]
    for j, (name, col, pt) in enumerate(series):
        side = "offset char 1.5,char 0 left" if j % 2 == 0 else "offset char -1.5,char 0 right"
        xs, ys = [float(r[col]) for r in rows], [float(r[col + 1]) for r in rows]
        for i, (r, x, y, ly) in enumerate(zip(rows, xs, ys, spread_labels(ys, gap, yrange[1] - gap / 2))):
            items.append(f"'-' using 1:2 with points pt {pt} ps 1.5 lc {i + 1} notitle")
            items.append(f"'-' using 1:2:3 with labels {side} notitle")
            data += [f"{x} {y}", "e", f'{x} {ly} "{name}, B = {r[0]}"', "e"]
    return (f"set yrange [{yrange[0]:.6g}:{yrange[1]:.6g}]\nplot " + ", \\\n     ".join(items) + "\n"
            + "\n".join(data))


def gnuplot_votes(dat, png):
    """Accuracy against N from a votes file (N, greedy, majority, weighted per row), the y-axis covering all."""
    votes = [[float(x) for x in line.split()] for line in open(dat)]
    return f"""
set output '{png}'
set title 'Accuracy vs samples per query N (greedy: one answer per query, for reference)'
set xlabel 'N'; set ylabel 'accuracy'; set logscale x 2; set key below horizontal
set yrange {padded_range([v for r in votes for v in r[1:]], 0.25, floor=0, ceil=1, min_span=0.1)}
plot '{dat}' using 1:2 with linespoints lw 2 title 'greedy', '' using 1:3 with linespoints lw 2 title 'majority', \\
     '' using 1:4 with linespoints lw 2 title 'verifier-weighted'
unset logscale x; set autoscale
"""


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
        self.curve_window = write_curve(f"{out}/grpo/metrics.jsonl", f"{out}/grpo_curve.dat", budgets)
        self.base_point = (tok, acc)
        self.budgets = budgets

    def table2_3(self):
        out = self.out

        routed = vote_table(f"{out}/pipeline.log")
        always = vote_table(f"{out}/pipeline-always.log")
        self.p(f"### 2. Greedy vs majority vs verifier-weighted vote ({len(jsonl(f'{out}/eval_mix.jsonl'))} problems, "
               "half k = 1, half k = 2..8; GRPO adapter, temperature 0.8, switcher on)")
        self.p()
        self.lines += vote_lines(routed, f"{out}/votes.dat")
        heads = {}
        for h in ("switcher", "verifier"):
            with open(f"{out}/heads/{h}.json") as f:
                j = json.load(f)
            # ROC-AUC over every held-out record; the accuracy at the threshold on the held-out records that
            # did not choose it (ertrain heads' report split)
            heads[h] = (find(j, "val_roc_auc"), find(j, "report_accuracy"), find(j, "report_split"))
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
        self.p(f"Tokens saved by routing: {100 * saved:.1f}%. Switcher ROC-AUC on the evaluation problems "
               f"(label: the record's needs_reasoning, k > 1): {fmt_auc(auc)}; on its own held-out split: {fmt_auc(heads['switcher'][0])}. "
               f"Verifier held-out ROC-AUC: {fmt_auc(heads['verifier'][0])}. "
               "Accuracy at the thresholds, on held-out records other than those that chose them "
               f"({heads['switcher'][2]} split): switcher {fmt_acc(heads['switcher'][1])}, "
               f"verifier {fmt_acc(heads['verifier'][1])}.")
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
        pareto = [[float(x) for x in line.split()] for line in open(f"{out}/pareto.dat")]
        xs = [r[1] for r in pareto] + [r[3] for r in pareto] + [self.base_point[0]]
        ys = [r[2] for r in pareto] + [r[4] for r in pareto] + [self.base_point[1]]
        script = f"""
set terminal pngcairo size 900,640
set grid
set output '{fd}/{pre}length_accuracy.png'
set title 'Held-out accuracy vs mean generated length (greedy), each point labelled by its stated budget B'
set xlabel 'mean generated tokens'; set ylabel 'accuracy'
set xrange {padded_range(xs, 0.2, floor=0)}; unset key
{pareto_plot(f'{out}/pareto.dat', self.base_point, padded_bounds(ys, 0.2, floor=0, ceil=1))}
set autoscale
{gnuplot_curves(f"{out}/grpo_curve.dat", f"{fd}/{pre}grpo_curves.png", self.budgets, self.curve_window,
                "GRPO: reward, rollout accuracy and rollout length per stated budget")}
{gnuplot_votes(f"{out}/votes.dat", f"{fd}/{pre}votes.png")}
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
        rel = lambda name: os.path.relpath(f"{fd}/{pre}{name}", os.path.dirname(os.path.abspath(self.a.results)))
        self.p(f"![accuracy vs length]({rel('length_accuracy.png')}) ![GRPO curves]({rel('grpo_curves.png')}) "
               f"![votes]({rel('votes.png')})")
        self.p()

    def write(self):
        a = self.a
        head = [f"# Demo results{' (QUICK=1: wiring check, not quality)' if a.quick else ''}", "",
                "Read this to see every stage of the pipeline measured side by side on the committed tiny base; "
                "the analysis of these effects and the `make paper` run are in docs/experiments.md.", "",
                f"Made by `make demo{' QUICK=1' if a.quick else ''}` (scripts/demo.sh) in {a.seconds} s; every "
                f"number below comes from that run's files in `{a.out}`.", ""]
        write_report(a.results, "\n".join(head + self.lines) + "\n")


def write_report(path, text):
    """Writes the report atomically and prints it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    print(text)
    print(f"wrote {path}")


def parse_args(*report_flags):
    """The flags both reports take, and each report's own (its output file's flag first)."""
    ap = argparse.ArgumentParser()
    for flag in ("--out", *report_flags, "--budgets", "--eval-budget"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--quick", type=int, default=0)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--load", type=float, help="the 5-minute load average at the run's end (default: now)")
    return ap.parse_args()


def run_report(prog, report, stages):
    """Runs the report's stages in order, then writes it; a missing or malformed run file ends with one line."""
    try:
        for stage in stages:
            stage()
    except (OSError, KeyError, ValueError, IndexError, StopIteration) as e:
        sys.exit(f"{prog}: {report.a.out}: {type(e).__name__}: {e}")
    report.write()


def main():
    r = Report(parse_args("--results"))
    run_report("demo_report", r, (r.table1, r.table2_3, r.table4, r.table5, r.plots))


if __name__ == "__main__":
    main()
