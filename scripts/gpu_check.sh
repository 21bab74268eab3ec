#!/usr/bin/env bash
# The GPU check: everything the CUDA backend is checked by, in one call on a GPU machine that has nvcc,
# PyTorch, transformers and peft but no package manager and no network.
#
#   scripts/gpu_check.sh --prepare     here (Debian, network): downloads the .debs of the libraries the
#                                      build and the tests link (cJSON, PCRE2, utf8proc, Criterion and
#                                      what they need) into build/gpu/debs and builds the CUDA binaries
#                                      into build/gpu/bin (make CUDA=1 BLAS=0), so either way works there
#   scripts/gpu_check.sh OUT           there (carry build/gpu): unpacks the .debs into a prefix (not into
#                                      /), builds with the machine's nvcc (or falls back to the carried
#                                      binaries), then runs its stages, each under `timeout` (the whole at
#                                      most 5 minutes after the build):
#                                        1. backend   the backend suite under compute-sanitizer memcheck
#                                                     (the large shapes left out), then plain
#                                        2. sft       30 SFT steps on the GPU against the CPU, a GPU run
#                                                     killed mid-way and resumed
#                                        3. peft      the PEFT cross-check both ways
#                                        4. bench     the LoRA step at 0.5B/1.5B/7B, 2048 tokens, against
#                                                     PyTorch + PEFT on the same GPU; 7B at 4096 recomputed
#                                        5. grpo      20 GRPO steps on the GPU against the CPU (rollout
#                                                     hashes, rewards, gradient norms)
#                                        6. decode    bench/gpu_decode: N = 1, 8, 64 samples on the 0.5B and
#                                                     7B shapes in bf16 against the weight-read bound
#                                                     (DECODE_SHAPES="0.5b 7b")
#                                        7. grpostep  one GRPO step on the 1.5B shape, P = 8, G = 8, budgets
#                                                     256 to 1024: rollout and update times
#                                      OUT gets two files: summary.txt (the table, printed last too) and
#                                      logs.tar.gz (every stage's log, the machine, the build).
#   STAGES="backend sft" scripts/gpu_check.sh OUT    runs only those stages.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
GPU=build/gpu

prepare() {
  set -e
  # Portable to the GPU machine's processor (x86-64-v3: AVX2, FMA, F16C), which may lack this one's extensions;
  # from scratch, since make does not rebuild objects whose flags alone changed.
  # (the Makefile builds a non-native ARCH into a folder of its own)
  local b=build/noblas/march_x8664v3/cuda
  rm -rf "$b"
  make CUDA=1 BLAS=0 ARCH=-march=x86-64-v3 -j"$(nproc)" all "$b/test_all" "$b/bench/train_step" \
    "$b/bench/gpu_decode" "$b/bench/gpu_grpo_step" >/dev/null
  mkdir -p "$GPU/debs" "$GPU/bin/bench"
  cp "$b/ertrain" "$b/erinfer" "$b/test_all" "$GPU/bin/"
  cp "$b/bench/train_step" "$b/bench/gpu_decode" "$b/bench/gpu_grpo_step" "$GPU/bin/bench/"
  # The packages of every shared library the binaries load, but the C runtime and the CUDA libraries
  # (the GPU machine has its own), and the headers for building there.
  pkgs="libcjson-dev libpcre2-dev libutf8proc-dev libcriterion-dev libboxfort-dev"
  for lib in $(ldd "$GPU/bin/test_all" | awk '$3 ~ /^\// {print $3}'); do
    p=$(dpkg -S "*/$(basename "$lib")" 2>/dev/null | head -1 | cut -d: -f1) || true
    case "$p" in "" | libc6 | libgcc-s1 | libgomp1 | libstdc++6 | *-cross | *i386*) ;; *) pkgs="$pkgs $p" ;; esac
  done
  (cd "$GPU/debs" && rm -f ./*.deb && apt-get download $(echo "$pkgs" | tr ' ' '\n' | sort -u) 2>&1 |
    grep -v 'unsandboxed' || true)
  du -sh "$GPU" | sed 's/^/gpu_check: prepared (carry it): /'
}

if [ "${1:-}" = --prepare ]; then
  prepare
  exit $?
fi
OUT=${1:?usage: scripts/gpu_check.sh --prepare | [STAGES="..."] scripts/gpu_check.sh OUT}
STAGES=${STAGES:-backend sft peft bench grpo decode grpostep}
mkdir -p "$OUT"
export LOG=/tmp/er_gpu_logs ROWS=/tmp/er_gpu_logs/rows.txt
rm -rf "$LOG" && mkdir -p "$LOG"
t_start=$(date +%s)
# One row of the summary table (the stages run in their own shells: rows go through a file).
row() { printf '%-34s %s\n' "$1" "$2" >>"$ROWS"; }

# ---- the libraries, unpacked into a prefix ----
prefix=/tmp/er_prefix
mkdir -p "$prefix"
# A .deb is an ar archive holding data.tar.*: unpacked by Python, which is there (dpkg may not be).
python3 - "$prefix" "$GPU"/debs/*.deb <<'PY'
import io, sys, tarfile
for deb in sys.argv[2:]:
    data = open(deb, "rb").read()
    i = 8  # after "!<arch>\n"
    while i + 60 <= len(data):
        name, size = data[i:i + 16].decode().strip().rstrip("/"), int(data[i + 48:i + 58])
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(data[i + 60:i + 60 + size])) as t:
                t.extractall(sys.argv[1], filter="fully_trusted")
        i += 60 + size + (size & 1)
PY
libdir=$prefix/usr/lib/x86_64-linux-gnu
export CPATH=$prefix/usr/include:$prefix/usr/include/x86_64-linux-gnu
export LIBRARY_PATH=$libdir:$prefix/lib/x86_64-linux-gnu
nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
export CUDA_HOME=$(dirname "$(dirname "$nvcc_path")")
# Only our programs load the prefix's libraries (python3 and the toolchain keep the machine's own).
export ER_LD_LIBRARY_PATH=$libdir:$prefix/lib/x86_64-linux-gnu:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}
er() { LD_LIBRARY_PATH=$ER_LD_LIBRARY_PATH "$@"; }
{ nvidia-smi; "$nvcc_path" --version; uname -a; git log -1 --format='commit %H %s' 2>/dev/null; } >"$LOG/machine.txt" 2>&1
row "commit" "$(git log -1 --format='%h %s' 2>/dev/null | cut -c1-80)"
row "gpu" "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# ---- build here with nvcc (the GPU's own arch only: quicker), else the carried binaries ----
export bin=build/noblas/cuda
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
# ld finds the libraries our libraries need (Criterion's nanomsg, ...) through -rpath-link, not -L.
if make CUDA=1 BLAS=0 CUDA_HOME="$CUDA_HOME" ${arch:+CUDA_ARCHS=$arch} \
  LDFLAGS="-fopenmp -Wl,-rpath-link,$libdir:$prefix/lib/x86_64-linux-gnu" \
  -j"$(nproc)" all $bin/test_all $bin/bench/train_step $bin/bench/gpu_decode $bin/bench/gpu_grpo_step \
  >"$LOG/build.log" 2>&1; then
  row "build" "built here with $nvcc_path${arch:+ for sm_$arch} ($(( $(date +%s) - t_start )) s)"
else
  bin=$GPU/bin
  row "build" "FAILED here (build.log); using the carried binaries"
fi
er "$bin/ertrain" version >"$LOG/version.txt" 2>&1
row "ertrain version" "$(grep '^device' "$LOG/version.txt" | head -1)"
export OMP_WAIT_POLICY=passive ER_TEST_DEVICE=cuda ER_BUILD=$bin

# ---- 1. the backend suite: every op and the whole model on the GPU against the CPU ----
stage_backend() {
  local big='qwen05b_shape_masked_lora|matmul_bf16_chunked' # minutes under memcheck: plain run only
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls "$CUDA_HOME"/bin/compute-sanitizer \
    "$CUDA_HOME"/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$sanitizer" ]; then
    er "$sanitizer" --tool memcheck --leak-check no --error-exitcode 86 "$bin/test_all" --jobs 1 \
      --filter "backend/!($big)" >"$LOG/backend_memcheck.log" 2>&1
    row "backend tests under memcheck" "exit $? ($(grep -a 'Synthesis' "$LOG/backend_memcheck.log" | tail -1 |
      sed 's/.*Synthesis: //'); $(grep -ac '^========= Invalid\|^========= Program hit' "$LOG/backend_memcheck.log") errors)"
  else
    row "backend tests under memcheck" "NOT RUN: no compute-sanitizer in PATH or $CUDA_HOME"
  fi
  er "$bin/test_all" --jobs 1 --filter 'backend*/*' >"$LOG/backend_tests.log" 2>&1
  row "backend tests (cuda vs cpu)" "$(grep -a 'Synthesis' "$LOG/backend_tests.log" | tail -1 | sed 's/.*Synthesis: //' |
    grep . || echo "FAILED to run (backend_tests.log)")$(
    n=$(grep -ac 'SKIPPED, nothing was checked' "$LOG/backend_tests.log"); [ "$n" -gt 0 ] && echo " ($n SKIPPED: no device)")"
}

# ---- 2. 30 SFT steps on the GPU and on the CPU; a GPU run killed mid-way and resumed ----
stage_sft() {
  local w=/tmp/er_gpu_sft
  rm -rf "$w" && mkdir -p "$w"
  er "$bin/ertrain" synth chains --n 400 --out "$w/chains.jsonl" >/dev/null 2>&1
  local flags=(sft --model models/tiny-base --data "$w/chains.jsonl" --response-key concise --steps 30 --batch 8
               --lr 5e-3 --save-every 5 --eval-every 10 --seed 1)
  er "$bin/ertrain" "${flags[@]}" --device cuda --out "$w/gpu"
  er "$bin/ertrain" "${flags[@]}" --device cpu --out "$w/cpu"
  # The program itself in the background (not a shell function, whose kill would leave it running),
  # killed with SIGKILL once it has logged 12 steps, then resumed from its last checkpoint.
  LD_LIBRARY_PATH=$ER_LD_LIBRARY_PATH "$bin/ertrain" "${flags[@]}" --device cuda --out "$w/gpu_r" &
  local pid=$!
  while kill -0 $pid 2>/dev/null && [ "$(cat "$w/gpu_r/metrics.jsonl" 2>/dev/null | wc -l)" -lt 12 ]; do sleep 0.01; done
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  local killed_at=$(cat "$w/gpu_r/metrics.jsonl" 2>/dev/null | wc -l)
  er "$bin/ertrain" "${flags[@]}" --device cuda --out "$w/gpu_r" --resume
  row "sft 30 steps cuda vs cpu" "$(python3 - "$w" "$killed_at" <<'PY' 2>&1
import json, sys
w, killed = sys.argv[1], int(sys.argv[2])
def losses(d):
    rows = {}
    for line in open(f"{w}/{d}/metrics.jsonl"):
        r = json.loads(line)
        rows[r["step"]] = r["loss"]  # a resumed run logs the steps after its checkpoint again
    return [rows[k] for k in sorted(rows)]
try:
    g, c, r = losses("gpu"), losses("cpu"), losses("gpu_r")
except OSError as e:
    sys.exit(f"FAILED (sft.log): {e}")
rel = max(abs(a - b) / abs(b) for a, b in zip(g, c))
res = max(abs(a - b) for a, b in zip(r, g))
kill = (f"killed after {killed} steps and resumed: max |diff| {res:.1e} over {len(r)} steps" if 5 <= killed < 30
        else f"resume NOT checked: the kill came after {killed} steps")
print(f"loss max rel diff {rel:.2e} over {len(g)} steps ({c[0]:.4f} -> {c[-1]:.4f} on the cpu); {kill}")
PY
)"
}

# ---- 3. PEFT cross-check (independent: Hugging Face peft loads our adapter and we load its) ----
stage_peft() {
  python3 scripts/peft_check.py --build "$bin" --work /tmp/er_peft
  row "peft cross-check" "$(python3 - "$LOG/peft.log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], errors="replace") if l.startswith('{"check"')]
print("; ".join("%s: %.1e (tol %.0e)" % (r["check"], r["rel_err"], r["tol"]) for r in rows) or "FAILED (peft.log)")
PY
)"
}

# ---- 4. LoRA SFT step, rank 16, bf16 base, 2048 tokens: ours vs PyTorch + PEFT ----
stage_bench() {
  local shape ours peer
  for shape in 0.5b 1.5b 7b; do
    ours=$(er "$bin/bench/train_step" --device cuda --shape $shape --lora 16 --bf16 --seq 2048 --steps 3)
    peer=$(python3 bench/train_step_peft.py --shape $shape --seq 2048 --rank 16 --steps 3)
    printf '%s\n%s\n' "$ours" "$peer" >>"$LOG/bench.jsonl"
    row "lora step $shape (2048 tok)" "$(python3 - "$ours" "$peer" <<'PY'
import json, sys
try:
    o, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    mfu = o["gflops"] / 1e3 / p["bf16_peak_tflops"]
    print("ours %.0f tok/s, peft %.0f tok/s: %.2fx; MFU ours %.1f%% peft %.1f%% (bf16 peak %.0f TFLOP/s measured)"
          % (o["tokens_per_s"], p["tokens_per_s"], o["tokens_per_s"] / p["tokens_per_s"], 100 * mfu,
             100 * p["mfu"], p["bf16_peak_tflops"]))
except Exception as e:
    print("FAILED (bench.log):", e)
PY
)"
  done
  # 7B at 4096 positions with recomputation: does it fit a 24 GB card (bf16 base ~15.2 GB + activations)?
  local rc7=$(er "$bin/bench/train_step" --device cuda --shape 7b --lora 16 --bf16 --recompute --seq 4096 --steps 2)
  echo "$rc7" >>"$LOG/bench.jsonl"
  row "7b, 4096 tok, --recompute" "$(python3 - "$rc7" <<'PY'
import json, sys
try:
    o = json.loads(sys.argv[1])
    need = o["params"] * 2 / 2**30 + o["acts_mib"] / 1024  # the bf16 base + activations
    print("%.0f tok/s, activations %.1f GiB, about %.1f GiB with the base: %s a 24 GB card"
          % (o["tokens_per_s"], o["acts_mib"] / 1024, need, "fits" if need < 22.3 else "does NOT fit"))
except Exception as e:
    print("FAILED (bench.log):", e)
PY
)"
}

# ---- 5. GRPO: 20 steps on the GPU and on the CPU from the same adapter and seed ----
# Rollouts at temperature 1 draw the same tokens while the two logits agree past every draw's margin: the
# rollout hashes match up to the first step where the GPU's bf16 base tipped a draw, and the rewards with them.
stage_grpo() {
  local w=/tmp/er_gpu_grpo
  rm -rf "$w" && mkdir -p "$w"
  er "$bin/ertrain" synth chains --n 200 --seed 2 --out "$w/chains.jsonl" --tokenizer models/tiny-base >/dev/null 2>&1
  er "$bin/ertrain" sft --model models/tiny-base --data "$w/chains.jsonl" --response-key concise --steps 20 --batch 8 \
    --lr 5e-3 --device cpu --out "$w/sft" >/dev/null 2>&1
  local d
  for d in cuda cpu; do
    er "$bin/ertrain" grpo --model models/tiny-base --adapter "$w/sft" --data "$w/chains.jsonl" --out "$w/$d" \
      --steps 20 --group 8 --prompts 4 --budgets 32,64 --temperature 1 --device $d
  done
  row "grpo 20 steps cuda vs cpu" "$(python3 - "$w" <<'PY' 2>&1
import json, sys
w = sys.argv[1]
try:
    g, c = ([json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")] for d in ("cuda", "cpu"))
except OSError as e:
    sys.exit(f"FAILED (grpo.log): {e}")
same = 0
while same < min(len(g), len(c)) and g[same]["rollout_hash"] == c[same]["rollout_hash"]:
    same += 1
dr = max(abs(a["reward"] - b["reward"]) for a, b in zip(g[:same], c[:same])) if same else float("nan")
dg = max(abs(a["grad_norm"] - b["grad_norm"]) / max(abs(b["grad_norm"]), 1e-12) for a, b in zip(g[:same], c[:same])) \
    if same else float("nan")
tps = [r.get("rollout_tokens_per_s", 0) for r in (g[-1], c[-1])]
print(f"rollouts identical for {same} of {len(c)} steps (rewards max |diff| {dr:.2g}, grad norm max rel diff {dg:.2g}); "
      f"rollout tokens/s {tps[0]:.0f} cuda, {tps[1]:.0f} cpu")
PY
)"
}

# ---- 6. decode against the weight-read bound: N = 1, 8, 64 samples on the 0.5B and 7B shapes, bf16 ----
stage_decode() {
  local shape
  for shape in ${DECODE_SHAPES:-0.5b 7b}; do
    local summary
    er "$bin/bench/gpu_decode" --device cuda --shape $shape --rows 1,8,64 --new-tokens 32 >>"$LOG/decode.jsonl"
    summary=$(tail -1 "$LOG/decode.jsonl" | sed -n 's/^gpu_decode //p')
    row "decode $shape (bf16)" "${summary:-FAILED (decode.log)}"
  done
}

# ---- 7. one GRPO step on the 1.5B shape (P = 8, G = 8, budgets 256 to 1024), the rollout and the update timed ----
stage_grpostep() {
  local out
  out=$(er "$bin/bench/gpu_grpo_step" --device cuda --shape 1.5b --prompts 8 --group 8 --budgets 256,512,768,1024 \
    --steps 1 --no-warmup)
  echo "$out" >>"$LOG/grpostep.jsonl"
  row "grpo step 1.5b (P 8, G 8)" "$(python3 - "$out" <<'PY'
import json, sys
try:
    o = json.loads(sys.argv[1])
    print("rollout %.1f s (%d tokens, %.0f tok/s), update %.1f s: rollouts %.0f%% of the step (first step, cold)"
          % (o["rollout_s"], o["rollout_tokens"], o["rollout_tokens_per_s"], o["update_s"], 100 * o["rollout_share"]))
except Exception as e:
    print("FAILED (grpostep.log):", e)
PY
)"
}

# Seconds each stage may take (the whole at most 5 minutes after the build); a stage past its limit is
# killed with what it started, and its row says so.
declare -A LIMIT=([backend]=70 [sft]=40 [peft]=35 [bench]=55 [grpo]=30 [decode]=40 [grpostep]=30)
export -f er row stage_backend stage_sft stage_peft stage_bench stage_grpo stage_decode stage_grpostep
for s in $STAGES; do
  [ -n "${LIMIT[$s]:-}" ] || { row "$s" "unknown stage (stages: ${!LIMIT[*]})"; continue; }
  t0=$(date +%s)
  timeout -k 5 "${LIMIT[$s]}" bash -c "stage_$s" >"$LOG/$s.log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    row "$s" "TIMED OUT after ${LIMIT[$s]} s ($s.log); its rows above are what finished"
  fi
  row "$s stage" "exit $rc in $(( $(date +%s) - t0 )) s (of ${LIMIT[$s]})"
done

row "not built yet" "sampling on the device (the logits come to the host each step); CUDA graphs for the decode step"
row "wall time" "$(( $(date +%s) - t_start )) s"
{ echo "== gpu_check summary =="; cat "$ROWS"; } >"$OUT/summary.txt"
tar -czf "$OUT/logs.tar.gz" -C "$LOG" --exclude rows.txt .
cat "$OUT/summary.txt"
