#!/usr/bin/env python3
"""PEFT cross-check: our LoRA adapter files are PEFT's, in both directions.

Needs torch, transformers and peft (the GPU machine has them; scripts/gpu_check.sh runs this there).

Both on a random Qwen2-shaped HF dir (`ertrain init` of configs/tiny.json) and on a Qwen3-shaped one
(configs/qwen3-tiny.json: transformers' Qwen3, with its q/k norms):
1. The dir and an adapter trained on it by
   `ertrain sft --no-mask` (standard LoRA: on at every position, which is what PEFT applies). PEFT loads
   the adapter with `PeftModel.from_pretrained` over transformers' model in fp32; its per-token
   log-probs of random sequences are compared with `erinfer score`'s on the same dir and adapter.
2. The other direction: an adapter PEFT initialises (`get_peft_model`, B then set to random values so
   it does something) and saves with `save_pretrained`, scored by `erinfer score --adapter`.

Passes when both agree to --tol relative (max |ours - peft| / max |peft|; default 1e-4, fp32).
Prints one JSON line per direction and exits 1 on a mismatch.

    python3 scripts/peft_check.py --build build --work /tmp/peft_check [--tol 1e-4]
"""
import argparse
import json
import os
import subprocess
import sys

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def run(cmd):
    # Our programs may need libraries of their own (scripts/gpu_check.sh unpacks them into a prefix and
    # names it in ER_LD_LIBRARY_PATH); this Python keeps the machine's.
    env = dict(os.environ)
    if "ER_LD_LIBRARY_PATH" in env:
        env["LD_LIBRARY_PATH"] = env["ER_LD_LIBRARY_PATH"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def sequences(vocab, n, length, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def ours(build, model, adapter, seqs, work, tag):
    inp, out = os.path.join(work, tag + "_in.jsonl"), os.path.join(work, tag + "_out.jsonl")
    with open(inp, "w") as f:
        for s in seqs:
            f.write(json.dumps({"tokens": s}) + "\n")
    run([os.path.join(build, "erinfer"), "score", "--model", model, "--adapter", adapter, "--input", inp,
         "--output", out])
    with open(out) as f:
        return [json.loads(line)["logprobs"] for line in f]


def peft_logprobs(model, seqs):
    rows = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            logits = model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            rows.append([lp[i, s[i + 1]].item() for i in range(len(s) - 1)])
    return rows


def compare(a, b):
    assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)), "different numbers of log-probs"
    err = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    ref = max(abs(y) for rb in b for y in rb)
    return err / ref


def load_base(path):
    from transformers import AutoModelForCausalLM
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # older transformers name the argument torch_dtype
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ok = True
    for config in ("configs/tiny.json", "configs/qwen3-tiny.json"):
        ok &= check_config(args, config)
    sys.exit(0 if ok else 1)


def check_config(args, config):
    """Both directions on a random model of config; True when both agree within args.tol."""
    from peft import LoraConfig, PeftModel, get_peft_model

    name = os.path.splitext(os.path.basename(config))[0]
    work = os.path.join(args.work, name)
    os.makedirs(work, exist_ok=True)
    ertrain = os.path.join(args.build, "ertrain")
    base, data = os.path.join(work, "base"), os.path.join(work, "chains.jsonl")
    sft, peft_dir = os.path.join(work, "sft"), os.path.join(work, "peft_init")
    run([ertrain, "init", "--config", config, "--out", base, "--tokenizer", "data/tiny_tokenizer",
         "--seed", "3", "--std", "0.08"])
    run([ertrain, "synth", "chains", "--n", "64", "--out", data])
    run([ertrain, "sft", "--model", base, "--data", data, "--response-key", "concise", "--no-mask", "--rank", "8",
         "--steps", "6", "--lr", "2e-2", "--batch", "8", "--seq-len", "128", "--device", "cpu", "--out", sft])
    vocab = json.load(open(os.path.join(base, "config.json")))["vocab_size"]
    seqs = sequences(vocab, 4, 48, 5)
    ok = True

    # 1. our adapter in PEFT
    m = PeftModel.from_pretrained(load_base(base), sft).eval()
    err = compare(ours(args.build, base, sft, seqs, work, "sft"), peft_logprobs(m, seqs))
    print(json.dumps({"check": "%s: ertrain sft adapter loaded by peft" % name, "rel_err": err, "tol": args.tol}),
          flush=True)
    ok &= err <= args.tol

    # 2. PEFT's adapter in erinfer
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    m = get_peft_model(load_base(base), cfg)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for pname, p in m.named_parameters():
            if "lora_B" in pname:  # PEFT starts B at zero: give the adapter something to do
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    m.save_pretrained(peft_dir)
    m.eval()
    err = compare(ours(args.build, base, peft_dir, seqs, work, "peft"), peft_logprobs(m, seqs))
    print(json.dumps({"check": "%s: peft-saved adapter scored by erinfer" % name, "rel_err": err, "tol": args.tol}),
          flush=True)
    ok &= err <= args.tol
    return ok


if __name__ == "__main__":
    main()
