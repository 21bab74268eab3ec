#!/usr/bin/env python3
"""Helpers of scripts/paper_report.py (make demo's and make paper's report): reading the run's files (JSONL, the
vote tables erinfer eval prints, GRPO's metrics), ROC-AUC, gnuplot scripts, the atomic write and the flags."""
import argparse
import json
import os
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


def write_report(path, text):
    """Writes the report atomically and prints it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    print(text)
    print(f"wrote {path}")


def parse_args(*report_flags):
    """The report's flags (report_flags: its own required ones, its output file's flag first)."""
    ap = argparse.ArgumentParser()
    for flag in ("--out", *report_flags, "--budgets", "--eval-budget"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--quick", type=int, default=0)
    ap.add_argument("--demo", type=int, default=0)
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
