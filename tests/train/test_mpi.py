#!/usr/bin/python3
"""The data-parallel runs (train/dist.h) under mpirun on localhost, against one rank.

  make MPI=1 test-mpi          (installs OpenMPI; or ER_BUILD=build/mpi python3 tests/train/test_mpi.py)
  make MPI=1 SAN=1 test-mpi    the same binaries under ASan + UBSan

Each check runs the same command as one plain process and under `mpirun -np 2` (sft also -np 4, where
the short last batch of an epoch leaves ranks without a row) and compares what rank 0 wrote:
  - sft, pretrain, qat: loss, gradient norm, held-out loss and token counts of every step, and the
    trained parameters (the adapter, the model, qat's master weights in its checkpoint), within 1e-6
    relative: the runs differ only in the order the gradient is summed (not bitwise: see docs/mpi.md); qat's
    steps after the first within 1e-5 (its fake quantizer rounds weights that differ in the last bits);
  - grpo, every loss type, 5 steps: the same rollouts (rollout_hash: the tokens of every completion),
    rewards, accuracy and lengths exactly, loss and adapter within 1e-6;
  - one rank SIGKILLed mid-run ends the job non-zero within seconds; --resume with 2 ranks then
    reproduces the uninterrupted 2-rank run's metrics and adapter bit for bit, and --resume with one
    rank continues it within 1e-6;
  - heads -np 3 and ertrain eval -np 3 (records split, results gathered in order) give one process's
    heads bit for bit and erinfer eval's records (wall-clock timings aside) and report;
  - an error on the ranks ends the job with one line naming the rank.
Prints one line per check and "test_mpi: N checks passed"; exits 1 at the first failure.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("ER_BUILD", "build/mpi")
ERTRAIN = os.path.join(ROOT, BUILD, "ertrain")
TOL = 1e-6
TENSOR_TOL = 1e-3
ENV = dict(os.environ, OMP_WAIT_POLICY="passive", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1",
           # OpenMPI's components stay loaded to the end, so LeakSanitizer can name (and the
           # suppressions match) their frames under make MPI=1 SAN=1.
           OMPI_MCA_mca_base_component_disable_dlclose="1")
# Timing fields differ between any two runs.
TIMING = {"tokens_per_s", "rollout_tokens_per_s", "train_tokens_per_s", "allreduce_s"}
checks = 0


def fail(msg):
    print("test_mpi: FAILED: " + msg, flush=True)
    sys.exit(1)


def passed(msg):
    global checks
    checks += 1
    print("test_mpi: ok: " + msg, flush=True)


def run(ranks, args, expect_ok=True, timeout=600, env=None):
    cmd = [ERTRAIN] + args
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
    p = subprocess.run(cmd, cwd=WORK, env=dict(ENV, **(env or {})), capture_output=True, text=True, timeout=timeout)
    if expect_ok and p.returncode != 0:
        fail("%s exited %d:\n%s%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    return p


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "I32": np.int32, "U8": np.uint8, "I8": np.int8, "BF16": np.uint16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).reshape(t["shape"])
    return out


def metrics(out):
    with open(os.path.join(WORK, out, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def compare_metrics(what, ref, got, exact=(), tol=TOL, floor=None):
    """Every field of every step within tol relative, `exact` ones equal. floor[k]: the scale below which
    field k is compared absolutely (a sum of O(1) terms that cancel)."""
    if len(ref) != len(got):
        fail("%s: %d metrics lines, one rank wrote %d" % (what, len(got), len(ref)))
    worst = 0.0
    for r, g in zip(ref, got):
        if set(r) != set(g):
            fail("%s step %s: keys %s vs %s" % (what, r.get("step"), sorted(g), sorted(r)))
        for k, v in r.items():
            if isinstance(v, dict):
                continue  # length_by_budget: compared through "length" and the rollout hash
            if k in exact or k in ("step", "epoch", "tokens", "lr"):
                if v != g[k]:
                    fail("%s step %s: %s = %r, one rank %r" % (what, r["step"], k, g[k], v))
            else:
                e = abs(v - g[k]) / max(abs(v), abs(g[k]), (floor or {}).get(k, 1e-30))
                worst = max(worst, e)
                if e > tol:
                    fail("%s step %s: %s = %r, one rank %r (relative %.2e > %g)" % (what, r["step"], k, g[k], v, e, tol))
    return worst


def compare_tensors(what, ref_path, got_path, names=None, tol=TOL, tensor_tol=TENSOR_TOL):
    """The parameters as one vector within tol relative (the optimizer's view), and each tensor within
    tensor_tol: AdamW scales each entry by its own gradient's size, so an entry whose gradient is a sum
    that nearly cancels (a zero-initialised lora_B's) moves by lr whatever the last bits say, and a
    small tensor's relative difference can exceed the vector's. Returns (vector, worst tensor)."""
    a, b = read_safetensors(os.path.join(WORK, ref_path)), read_safetensors(os.path.join(WORK, got_path))
    if sorted(a) != sorted(b):
        fail("%s: tensors %s vs %s" % (what, sorted(b), sorted(a)))
    num = den = worst = 0.0
    for k in names or a:
        x, y = a[k].astype(np.float64), b[k].astype(np.float64)
        d2, n2 = float(((x - y) ** 2).sum()), float((x ** 2).sum())
        num, den = num + d2, den + n2
        e = (d2 / max(n2, 1e-60)) ** 0.5
        worst = max(worst, e)
        if e > tensor_tol:
            fail("%s: tensor %s differs from one rank's by %.2e relative (> %g)" % (what, k, e, tensor_tol))
    e = (num / max(den, 1e-60)) ** 0.5
    if e > tol:
        fail("%s: the parameters differ from one rank's by %.2e relative (> %g)" % (what, e, tol))
    return e, worst


def checkpoint_tensors(out):
    d = os.path.join(out, "checkpoint")
    with open(os.path.join(WORK, d, "state.json")) as f:
        return os.path.join(d, json.load(f)["tensors"])


def check_sft():
    base = ["sft", "--model", MODEL, "--data", "chains.jsonl", "--response-key", "verbose", "--rank", "4", "--batch",
            "8", "--grad-accum", "2", "--steps", "5", "--seed", "1", "--threads", "1", "--eval-split", "0.1",
            "--eval-every", "2"]
    run(1, base + ["--out", "sft1"])
    for n in (2, 4):
        p = run(n, base + ["--out", "sft%d" % n])
        wm = compare_metrics("sft -np %d" % n, metrics("sft1"), metrics("sft%d" % n))
        wp = compare_tensors("sft -np %d adapter" % n, "sft1/adapter_model.safetensors",
                             "sft%d/adapter_model.safetensors" % n)
        passed("sft -np %d = one rank, batch 8 x 2 micro-batches, 5 steps over an epoch's short last batch (metrics "
               "%.1e, adapter %.1e, worst tensor %.1e relative)" % ((n, wm) + wp))
        # The plan line says where every rank runs.
        line = next((l for l in p.stdout.splitlines() if l.startswith("sft: rank 0 on ")), None)
        want = ", ".join(["%d on cpu" % r for r in range(1, n)])
        if not line or not line.startswith("sft: rank 0 on cpu (") or want not in line:
            fail("sft -np %d: no plan line naming every rank's device (want 'sft: rank 0 on cpu (...), %s'):\n%s"
                 % (n, want, p.stdout))
        passed("sft -np %d: the plan line names every rank's device: %s" % (n, line))
    # The trainer's device path (the model and adapter placed, here on copies on the CPU backend): the
    # gradients go through dist_sum_device_floats' host-staged sum (NCCL's fallback) and the run is the
    # unplaced run's bit for bit.
    run(2, base + ["--out", "sft2_placed"], env={"ER_TEST_PLACE_ON_CPU": "1"})
    compare_metrics("sft -np 2 placed", metrics("sft2"), metrics("sft2_placed"), tol=0)
    wp = compare_tensors("sft -np 2 placed adapter", "sft2/adapter_model.safetensors",
                         "sft2_placed/adapter_model.safetensors", tol=0, tensor_tol=0)
    passed("sft -np 2 placed on copies (the device path, gradients summed through the host) = unplaced, bit for bit")


def check_pretrain():
    base = ["pretrain", "--config", os.path.join(ROOT, "configs/tiny.json"), "--tokenizer",
            os.path.join(ROOT, "data/tiny_tokenizer"), "--data", "chains.jsonl", "--response-key", "verbose", "--batch", "8", "--steps", "3",
            "--seed", "2", "--threads", "1", "--eval-split", "0.1"]
    run(1, base + ["--out", "pre1"])
    run(2, base + ["--out", "pre2"])
    wm = compare_metrics("pretrain -np 2", metrics("pre1"), metrics("pre2"))
    wp = compare_tensors("pretrain -np 2 model", "pre1/model.safetensors", "pre2/model.safetensors")
    passed("pretrain -np 2 = one rank, batch 8, 3 steps (metrics %.1e, parameters %.1e, worst tensor %.1e relative)"
           % ((wm,) + wp))


def check_qat():
    base = ["qat", "--model", MODEL, "--data", "chains.jsonl", "--response-key", "verbose", "--weights", "q4", "--batch", "8", "--steps", "3",
            "--seed", "1", "--threads", "1", "--eval-split", "0.1"]
    run(1, base + ["--out", "qat1"])
    run(2, base + ["--out", "qat2"])
    ref, got = metrics("qat1"), metrics("qat2")
    # Step 1 starts from the same weights: within 1e-6. Later steps start from master weights ~1e-8 apart,
    # and a weight on a q4 rounding boundary can round the other way in one run only: on an AVX-512 machine
    # step 3's gradient norm differed by 1.0e-6 relative where steps 1 and 2 differed by 1e-8 (measured).
    # Those within 1e-5.
    w1 = compare_metrics("qat -np 2, at", ref[:1], got[:1])
    wm = compare_metrics("qat -np 2", ref, got, tol=1e-5)
    wp = compare_tensors("qat -np 2 master weights", checkpoint_tensors("qat1"), checkpoint_tensors("qat2"),
                         ["params", "adam.m", "adam.v"])
    passed("qat -np 2 = one rank, q4, batch 8, 3 steps (step 1 %.1e, later steps %.1e; master weights, AdamW m, v "
           "%.1e, worst %.1e relative)" % ((w1, wm) + wp))


def check_grpo():
    for loss in ("grpo", "bnpo", "dr_grpo", "dapo"):
        base = ["grpo", "--model", MODEL, "--adapter", "sft1", "--data", "chains.jsonl", "--budgets", "16,32",
                "--group", "4", "--prompts", "4", "--steps", "5", "--answer-tokens", "8", "--lr", "1e-3", "--beta",
                "0.01", "--seed", "3", "--threads", "1", "--scale-rewards", "batch", "--loss-type", loss]
        if loss == "grpo":
            base += ["--iterations", "2"]
        run(1, base + ["--out", "grpo1_" + loss])
        run(2, base + ["--out", "grpo2_" + loss])
        exact = ("rollout_hash", "reward", "accuracy", "length", "over_budget", "flat_groups")
        ref, got = metrics("grpo1_" + loss), metrics("grpo2_" + loss)
        # Step 1 starts from the same adapter: every field within 1e-6 relative, the global
        # normalisation of the loss type included (with --iterations 2 step 1's fields are its second
        # update's, from adapters one update apart, as later steps). Later steps start from adapters ~1e-6
        # apart (below):
        # within 1e-5, the loss, KL and gradient norm (sums of terms of size ~1, advantages, log-prob
        # differences, the clip at 1, that cancel to ~1e-4) within 1e-5 of max(|value|, 1).
        w1 = compare_metrics("grpo -np 2 --loss-type %s, at" % loss, ref[:1], got[:1], exact,
                             tol=1e-5 if loss == "grpo" else TOL, floor={"loss": 1.0, "kl": 1.0} if loss == "grpo" else None)
        wm = compare_metrics("grpo -np 2 --loss-type " + loss, ref, got, exact, tol=1e-5,
                             floor={"loss": 1.0, "kl": 1.0, "grad_norm": 1.0})
        # Most groups here are flat (their advantages 0), so the gradient is the small KL term's and AdamW
        # moves entries with near-cancelling gradients by lr whichever way the last bits point: the
        # adapter is compared within 1e-5.
        wp = compare_tensors("grpo -np 2 --loss-type %s adapter" % loss, "grpo1_%s/adapter_model.safetensors" % loss,
                             "grpo2_%s/adapter_model.safetensors" % loss, tol=1e-5)
        passed("grpo -np 2 = one rank, --loss-type %s, 5 steps: the same rollouts (hash of every step's tokens), "
               "rewards, lengths; step 1 %.1e, later steps %.1e, adapter %.1e, worst tensor %.1e relative" %
               ((loss, w1, wm) + wp))


def check_heads():
    base = ["heads", "--model", MODEL, "--adapter", "sft1", "--data", "chains.jsonl", "--limit", "24",
            "--derive-labels", "--target-recall", "0.9", "--samples", "4", "--max-new", "24", "--direct-max-new", "8",
            "--threads", "1", "--seed", "1", "--switcher-epochs", "20", "--verifier-epochs", "20",
            "--allow-one-class"]  # a wiring check: the tiny labels may hold one class
    one = run(1, base + ["--switcher-out", "heads1/sw", "--verifier-out", "heads1/vf"])
    two = run(3, base + ["--switcher-out", "heads3/sw", "--verifier-out", "heads3/vf"])
    for f in ("sw.safetensors", "sw.json", "vf.safetensors", "vf.json", "metrics.jsonl"):
        a, b = open(os.path.join(WORK, "heads1", f), "rb").read(), open(os.path.join(WORK, "heads3", f), "rb").read()
        if a != b:
            fail("heads -np 3: %s differs from one rank's" % f)
    runs = []
    for d in ("heads1", "heads3"):
        with open(os.path.join(WORK, d, "run.json")) as f:
            j = json.load(f)
        j.pop("seconds")
        j["config"] = {k: v for k, v in j["config"].items() if not k.endswith("_out")}
        runs.append(j)
    labels = [[l for l in p.stdout.splitlines() if "labels:" in l] for p in (one, two)]
    if runs[0] != runs[1] or labels[0] != labels[1] or len(labels[0]) != 2:
        fail("heads -np 3: run.json or the label report differs from one rank's:\n%s\n%s" % (labels[0], labels[1]))
    passed("heads -np 3 (records split, rows gathered in order) = one rank: both heads, metrics, run.json and the "
           "label counts bit for bit")


def check_eval():
    erinfer = os.path.join(ROOT, BUILD, "erinfer")
    for heads in ([], ["--switcher", "heads1/sw", "--verifier", "heads1/vf", "--vote-n", "1,3"]):
        base = ["--model", MODEL, "--adapter", "sft1", "--data", "chains.jsonl", "--limit", "20", "--samples", "3",
                "--max-new", "24", "--temperature", "0.8", "--seed", "2", "--threads", "1"] + heads
        p1 = subprocess.run([erinfer, "eval"] + base + ["--output", "eval1.jsonl"], cwd=WORK, env=ENV,
                            capture_output=True, text=True)
        if p1.returncode != 0:
            fail("erinfer eval: %s" % p1.stderr[-2000:])
        p3 = run(3, ["eval"] + base + ["--output", "eval3.jsonl"])
        a, b = ([json.loads(l) for l in open(os.path.join(WORK, f))] for f in ("eval1.jsonl", "eval3.jsonl"))
        for rec in a + b:  # the routed pipeline's per-item timings are wall clock
            rec.get("pipeline", {}).pop("timings", None)
        report = [[l for l in p.stdout.splitlines() if not l.startswith(("tokens/s", "wrote"))] for p in (p1, p3)]
        if a != b or report[0] != report[1] or not report[0]:
            fail("ertrain eval -np 3%s: records or report differ from erinfer eval's:\n%s\n%s" %
                 (" with heads" if heads else "", "\n".join(report[0]), "\n".join(report[1])))
        if any(os.path.exists(os.path.join(WORK, "eval3.jsonl.part%d" % r)) for r in range(3)):
            fail("ertrain eval -np 3 left a part file")
        passed("ertrain eval -np 3%s = erinfer eval: %d per-item records in order (timings aside), the same report "
               "(%s)" % (" --switcher --verifier" if heads else "", len(a), report[0][0]))


def rank_pid(mpirun_pid, rank):
    """The pid of `rank` among mpirun's children (OpenMPI tells each its rank in the environment)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            if ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
                return int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return None


def check_kill_and_resume():
    steps = 40
    base = ["sft", "--model", MODEL, "--data", "chains.jsonl", "--response-key", "verbose", "--rank", "4", "--batch",
            "8", "--steps", str(steps), "--save-every", "4", "--seed", "1", "--threads", "1", "--eval-split", "0.1",
            "--eval-every", "10"]
    run(2, base + ["--out", "whole"])
    cmd = ["mpirun", "--oversubscribe", "-np", "2", ERTRAIN] + base + ["--out", "killed"]
    p = subprocess.Popen(cmd, cwd=WORK, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mpath = os.path.join(WORK, "killed", "metrics.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(mpath) and sum(1 for _ in open(mpath)) >= 6:
            break
        time.sleep(0.005)
    victim = rank_pid(p.pid, 1)
    if p.poll() is not None or victim is None:
        fail("kill test: the run ended (or rank 1 was not found) before 6 steps: %s" % p.communicate()[1][-2000:])
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("kill test: the job did not end within 30 s of rank 1's SIGKILL")
    took = time.time() - t0
    lines = [l for l in err.splitlines() if "rank 1" in l and ("signal 9" in l or "Killed" in l)]
    if p.returncode == 0 or not lines:
        fail("kill test: exit %d, stderr without a line naming rank 1 and the signal:\n%s" % (p.returncode, err[-2000:]))
    done = len(metrics("killed"))
    if done >= steps:
        fail("kill test: rank 1 was killed after the last step")
    passed("SIGKILL of rank 1 after step >= 6: the job ended with exit %d in %.1f s: \"%s\"" %
           (p.returncode, took, lines[0].strip()))
    shutil.copytree(os.path.join(WORK, "killed"), os.path.join(WORK, "killed1"))
    run(2, base + ["--out", "killed", "--resume"])
    if metrics("killed") != metrics("whole"):
        fail("resume with 2 ranks: metrics.jsonl differs from the uninterrupted 2-rank run")
    compare_tensors("resume -np 2 adapter", "whole/adapter_model.safetensors", "killed/adapter_model.safetensors",
                    tol=0.0, tensor_tol=0.0)
    passed("--resume -np 2 from the last complete checkpoint: metrics and adapter bit for bit the uninterrupted run's")
    run(1, base + ["--out", "killed1", "--resume"])
    # Not bitwise: from the checkpoint on, one rank sums each gradient in another order than two, and the
    # difference grows with the steps left after the kill (which lands at step 4 or 8 depending on the
    # machine's speed): 6.5e-7 and 1.6e-6 relative seen over the last 32-36 steps. What the check is for, a
    # resume that restores the wrong state (moments, data position, RNG), moves the metrics by whole optimizer
    # updates, far above float rounding.
    wm = compare_metrics("resume with one rank", metrics("whole"), metrics("killed1"), tol=1e-5)
    wp = compare_tensors("resume with one rank adapter", "whole/adapter_model.safetensors",
                         "killed1/adapter_model.safetensors")
    passed("--resume with one rank continues the 2-rank run (metrics %.1e, adapter %.1e, worst tensor %.1e relative)"
           % ((wm,) + wp))


def check_errors():
    p = run(2, ["sft", "--model", MODEL, "--data", "chains.jsonl", "--out", "bad", "--batch", "3", "--steps", "1"],
            expect_ok=False)
    # Both ranks refuse it; whichever prints first ends the job.
    want = ": --batch 3 is the global batch: it must be a multiple of the 2 ranks"
    lines = [l for l in p.stderr.splitlines() if l.endswith(want) and
             l.startswith(("ertrain sft: rank 0 of 2", "ertrain sft: rank 1 of 2"))]
    if p.returncode == 0 or not lines:
        fail("bad --batch under 2 ranks: exit %d, stderr:\n%s" % (p.returncode, p.stderr[-2000:]))
    passed("an error under mpirun ends the job non-zero with the line \"%s\"" % lines[0])
    # One rank placed on a device (here copies on the CPU backend, the test hook) and one not: their gradient
    # sums are different collectives, so the job is refused up front instead of hanging in them.
    args = [ERTRAIN, "sft", "--model", MODEL, "--data", "chains.jsonl", "--response-key", "verbose", "--out", "mixed",
            "--batch", "2", "--steps", "1", "--threads", "1"]
    cmd = ["mpirun", "--oversubscribe", "-np", "1", "-x", "ER_TEST_PLACE_ON_CPU=1"] + args + [":", "-np", "1"] + args
    p = subprocess.run(cmd, cwd=WORK, env=ENV, capture_output=True, text=True, timeout=120)
    want = "1 of 2 ranks run on a device and the others on the CPU"
    if p.returncode == 0 or want not in p.stderr:
        fail("one rank placed, one not: exit %d, stderr:\n%s" % (p.returncode, p.stderr[-2000:]))
    passed("one rank on a device and one on the CPU: refused (\"%s\")" % want)


def main():
    global WORK, MODEL
    if not os.access(ERTRAIN, os.X_OK) or not shutil.which("mpirun"):
        fail("%s or mpirun missing: build with make MPI=1 (MPI=1 scripts/deps.sh installs OpenMPI)" % ERTRAIN)
    v = subprocess.run(["mpirun", "-np", "2", ERTRAIN, "version"], env=ENV, capture_output=True, text=True)
    if "ranks: 2 (MPI)" not in v.stdout:
        fail("%s under mpirun -np 2 does not see 2 ranks (not an MPI=1 build?):\n%s%s" % (ERTRAIN, v.stdout, v.stderr))
    WORK = tempfile.mkdtemp(prefix="er_mpi_")
    MODEL = os.path.join(ROOT, "models/tiny-base")
    t0 = time.time()
    subprocess.run([ERTRAIN, "synth", "chains", "--n", "64", "--seed", "3", "--max-steps", "3", "--out",
                    os.path.join(WORK, "chains.jsonl")], check=True, capture_output=True, env=ENV)
    check_errors()
    check_sft()
    check_pretrain()
    check_qat()
    check_grpo()
    check_heads()
    check_eval()
    check_kill_and_resume()
    shutil.rmtree(WORK)
    print("test_mpi: %d checks passed (%.0f s)" % (checks, time.time() - t0))


if __name__ == "__main__":
    main()
