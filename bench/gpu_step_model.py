#!/usr/bin/env python3
"""The expected time of one masked-LoRA SFT step (rank 16 on the seven linears, bf16 base, batch 1) on a GPU,
op by op from FLOPs and bytes, for this project's CUDA backend and for PyTorch + PEFT (bf16, SDPA flash
attention). An estimate to compare scripts/gpu_check.sh's measurements against, not a measurement:

  python3 bench/gpu_step_model.py [--seq 2048] [--tflops 989] [--tbps 3.35]   (an H100 SXM's dense bf16 and HBM)

Each op takes max(FLOPs / rate, bytes / bandwidth); the rates are the peak times an assumed efficiency (the
EFF table below), the assumptions being what the device check confirms or corrects. Counts follow
bench/train_step.c's lora_step_flops (the base's products forward and input-gradient, the LM head likewise).
"""
import argparse

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
    "7b": (3584, 28, 28, 4, 18944, 152064),
}
# Share of the peak a kind of op reaches (assumed): large bf16 cuBLAS products; batched (G*T x T) attention
# products; FlashAttention-2 in SDPA; the fp32 SIMT attention kernels (one warp per query, dot products by
# warp shuffles: of the 67 TFLOP/s fp32 peak); memory-bound kernels of their bandwidth.
EFF = {"gemm": 0.70, "att_gemm": 0.50, "flash": 0.40, "simt": 0.10, "mem": 0.70}
FP32_SIMT_TFLOPS = 67.0
LAUNCH_S = 5e-6  # one small kernel or cuBLAS call: launch-bound


def ops(shape, T, r, impl):
    C, L, NH, NKV, FF, V = SHAPES[shape]
    HS = C // NH
    qd, kvd = NH * HS, NKV * HS
    mat = C * qd + 2 * C * kvd + qd * C + 3 * C * FF
    rows = []  # (name, flops, rate TFLOP/s or None, bytes, launches)
    rows.append(("base products, fwd + input grad", 2 * 2 * T * L * mat, "gemm", 2 * 2 * L * mat, 2 * 7 * L))
    rows.append(("LM head, fwd + input grad", 2 * 2 * T * V * C, "gemm", 2 * 2 * V * C, 2))
    lora = r * ((C + qd) + 2 * (C + kvd) + (qd + C) + 2 * (C + FF) + (FF + C))
    rows.append(("LoRA products (fwd, 2 bwd)", 3 * 2 * T * L * lora, "gemm", 0, 3 * 2 * 7 * L))
    full = 2.0 * T * T * qd * L  # one (T x T) x HS product over all heads and layers, causal half not skipped
    if impl == "ours-simt":
        # forward 2 dots a (query, key) pair, backward 7 (dq kernel 3, dkv kernel 4), causal half only
        rows.append(("attention, fp32 SIMT kernels", 4.5 * full, "simt", 0, 3 * L))
    elif impl == "ours-tc":
        sp = NH * T * T * L * (4 + 4 + 2 + 2)  # S fp32 written and read, P bf16 written and read
        rows.append(("attention, cuBLAS bf16 (2 fwd + 5 bwd products)", 7 * full, "att_gemm", 3 * sp, 12 * L))
    else:
        rows.append(("attention, SDPA flash (causal half)", 7 * full / 2, "flash", 0, 2 * L))
    act = 4 if impl.startswith("ours") else 2  # fp32 activations here, bf16 in PyTorch
    # RMSNorm x2, RoPE on q and k, SwiGLU, two residuals: elements read + written a token, forward; backward 2x
    ew = 3 * ((2 * 2 * C) + 2 * (qd + kvd) + 3 * FF + 2 * 3 * C) * T * L * act
    if impl.startswith("ours"):  # bf16 copies of the products' inputs, 6 bytes an element: forward once per
        # activation (ln1 for q, k, v; attention out; ln2 for gate, up; the MLP's), backward each output gradient
        ew += ((2 * C + qd + FF) + (qd + 2 * kvd + 2 * C + 2 * FF)) * T * L * 6
    rows.append(("elementwise (norms, RoPE, SwiGLU, residuals, casts)", 0, None, ew, 14 * L))
    rows.append(("cross-entropy over the (T x V) fp32 logits", 0, None, 4 * 4 * T * V, 3))
    return rows


def seconds(row, tflops, tbps):
    name, flops, kind, nbytes, launches = row
    rate = (FP32_SIMT_TFLOPS if kind == "simt" else tflops) * 1e12 * EFF.get(kind or "mem", 1.0)
    t_flop = flops / rate if flops else 0.0
    t_mem = nbytes / (tbps * 1e12 * EFF["mem"])
    return max(t_flop, t_mem, launches * LAUNCH_S)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--tflops", type=float, default=989.0, help="dense bf16 peak, TFLOP/s")
    ap.add_argument("--tbps", type=float, default=3.35, help="HBM bandwidth, TB/s")
    a = ap.parse_args()
    print(f"expected masked-LoRA step, batch 1 x {a.seq} tokens, rank {a.rank}, at {a.tflops:.0f} TFLOP/s bf16 "
          f"and {a.tbps} TB/s; efficiencies {EFF}")
    for shape in SHAPES:
        print(f"\n{shape}:")
        tot = {}
        for impl in ("ours-simt", "ours-tc", "peft"):
            rows = ops(shape, a.seq, a.rank, impl)
            tot[impl] = sum(seconds(r, a.tflops, a.tbps) for r in rows)
            print(f"  {impl}: {1e3 * tot[impl]:.1f} ms = {a.seq / tot[impl]:.0f} tokens/s")
            for r in rows:
                print(f"    {r[0]:<52} {1e3 * seconds(r, a.tflops, a.tbps):8.2f} ms")
        print(f"  ours / peft tokens/s: SIMT attention {tot['peft'] / tot['ours-simt']:.2f}x, "
              f"tensor-core attention {tot['peft'] / tot['ours-tc']:.2f}x")


if __name__ == "__main__":
    main()
