#!/usr/bin/env python3
"""GPU peer for the LoRA SFT step: Hugging Face transformers' Qwen2 with a PEFT LoRA adapter.

    python3 bench/train_step_peft.py --shape 7b --seq 2048 --rank 16 --steps 5

The base has random weights in bf16 (frozen), the adapter is PEFT's LoRA (rank R, alpha 2R, dropout 0)
on all seven linears; one step is forward + cross-entropy + backward, like bench/train_step --device
cuda --bf16 --lora R (no optimizer step timed on either side). Attention is PyTorch's SDPA. Prints one
JSON line: {"impl": "pytorch+peft", "shape", "seq", "tokens_per_s", "step_s" (median), "tflops" (model
FLOPs counted as bench/train_step.c counts them), "bf16_peak_tflops" (an 8192^3 bf16 matmul measured in
the same run), "mfu" (tflops / that peak), "torch", "transformers", "peft"}.
"""
import argparse
import json
import statistics
import time

import torch

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, tied
    "0.5b": (896, 24, 14, 2, 4864, True),
    "1.5b": (1536, 28, 12, 2, 8960, True),
    "7b": (3584, 28, 28, 4, 18944, False),
}
VOCAB = 151936


def lora_step_flops(C, L, NH, NKV, FF, T, r):
    # the same count as lora_step_flops in bench/train_step.c (batch 1)
    HS = C // NH
    qd, kvd = NH * HS, NKV * HS
    mat = C * qd + 2 * C * kvd + qd * C + 3 * C * FF
    lora = r * ((C + qd) + 2 * (C + kvd) + (qd + C) + 2 * (C + FF) + (FF + C))
    att = sum(2.0 * 2.0 * (t + 1) * qd for t in range(T))
    return 2 * (2 * T * (L * mat + VOCAB * C)) + 3 * L * att + 3 * 2 * T * L * lora


def bf16_peak():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * 10 / (time.perf_counter() - t0) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    import peft
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    C, L, NH, NKV, FF, tied = SHAPES[args.shape]
    cfg = Qwen2Config(hidden_size=C, num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=NKV,
                      intermediate_size=FF, vocab_size=VOCAB, max_position_embeddings=32768, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=tied, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    lcfg = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, bias="none",
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                           task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lcfg)
    model.train()
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, VOCAB, (1, args.seq), device="cuda", generator=g)
    times = []
    for s in range(args.steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if s > 0:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    tflops = lora_step_flops(C, L, NH, NKV, FF, args.seq, args.rank) / step / 1e12
    peak = bf16_peak()
    print(json.dumps({"impl": "pytorch+peft", "shape": args.shape, "seq": args.seq, "lora_r": args.rank,
                      "step_s": round(step, 4), "tokens_per_s": round(args.seq / step, 1), "tflops": round(tflops, 1),
                      "bf16_peak_tflops": round(peak, 1), "mfu": round(tflops / peak, 3), "loss": round(loss.item(), 4),
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__}), flush=True)


if __name__ == "__main__":
    main()
