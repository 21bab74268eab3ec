#!/usr/bin/python3
"""Reference adapters and expected outputs for the C masked-LoRA tests.

    /usr/bin/python3 scripts/ref/make_lora_ref.py --out build/ref [--only CASE]

For each case writes OUT/<case>/:
    base/                   an HF model dir (config.json, model.safetensors), random tiny qwen2
    adapter/                a PEFT adapter written here (adapter_config.json as PEFT writes it, plus "er_mask"
                            for masked cases; adapter_model.safetensors with keys
                            base_model.model.model.layers.{l}.{self_attn|mlp}.{m}.lora_{A|B}.weight),
                            random A and random non-zero B
    expected.safetensors    tokens I32 [B,T] (right-padded with 0), lengths I32 [B], prompt_len I32 [B],
                            adapter_mask U8 [B,T] (masked: 0 on the prompt, 1 on the response, 0 on padding;
                            unmasked: all ones), targets I32 [B,T], loss_mask F32 [B,T] (masked: the positions
                            predicting response tokens; unmasked: every position with a next token),
                            logits F32 [B,T,V], loss F32 [1], grad.<adapter key> F32 for every lora_A/lora_B,
                            grad.inputs_embeds F32 [B,T,C]

Everything is computed in float64 from what was written (a BF16 adapter is used with its bf16-rounded values).
Each case checks itself before it is written: gradients against float64 central differences, a mask of
zeros gives the base model's logits exactly, the prompt positions of a masked case are the base model's,
the adapter changes the response positions by a visible amount, and padding does not reach valid positions.
"""

import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen2_ref as R  # noqa: E402
from make_ref import qwen2_config, qwen3_config  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))

ALL = list(R.LORA_TARGETS)

CASES = [
    dict(name="masked_all_targets", seed=1101, masked=True, targets=ALL, r=4, alpha=8.0, rslora=False,
         store="F32", lengths=[12, 10, 7], prompts=[5, 4, 3], T=12,
         cfg=qwen2_config(V=96, C=32, FF=64, L=2, NH=4, NKV=2, theta=10000.0, tied=True)),
    # set order, as PEFT writes target_modules; rsLoRA; the adapter tensors stored as BF16
    dict(name="masked_qv_rslora", seed=2202, masked=True, targets=["v_proj", "q_proj"], r=8, alpha=16.0,
         rslora=True, store="BF16", lengths=[11, 12, 8], prompts=[4, 6, 2], T=12,
         cfg=qwen2_config(V=96, C=48, FF=96, L=2, NH=6, NKV=2, theta=10000.0, tied=False)),
    # a plain PEFT adapter (no er_* keys): on at every position
    dict(name="unmasked_all", seed=3303, masked=False, targets=ALL, r=2, alpha=4.0, rslora=False,
         store="F32", lengths=[12, 8, 5], prompts=[4, 3, 2], T=12,
         cfg=qwen2_config(V=96, C=32, FF=64, L=3, NH=4, NKV=1, theta=10000.0, tied=True)),
    # Qwen3: per-head q/k norms between q_proj / k_proj (and their adapters) and RoPE
    dict(name="qwen3_masked_all_targets", seed=4404, masked=True, targets=ALL, r=4, alpha=8.0, rslora=False,
         store="F32", lengths=[12, 9, 6], prompts=[5, 3, 4], T=12,
         cfg=qwen3_config(V=96, C=32, FF=64, L=2, NH=4, NKV=2, HS=16, theta=1000000.0, tied=True)),
]


def adapter_config(case, base_path):
    """adapter_config.json as PEFT 0.13 writes it, plus this project's "er_mask" for masked adapters."""
    c = {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": base_path,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "loftq_config": {},
        "lora_alpha": case["alpha"],
        "lora_dropout": 0.0,
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": case["r"],
        "rank_pattern": {},
        "revision": None,
        "target_modules": case["targets"],
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": case["rslora"],
    }
    if case["masked"]:
        c["er_mask"] = "response"
        c["er_reasoning_prefix"] = "<think>\n"
    return c


def init_lora(cfg, case):
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming init), B ~ N(0, 0.2): B non-zero so that the
    adapter changes the output and every gradient is exercised."""
    g = torch.Generator().manual_seed(case["seed"] + 1)
    out = {}
    for name, shape in R.lora_shapes(cfg, case["targets"], case["r"]):
        if name.endswith("lora_A.weight"):
            bound = 1.0 / math.sqrt(shape[1])
            out[name] = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound
        else:
            out[name] = 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
    return out


def write_adapter(path, case, lora, base_path):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(adapter_config(case, base_path), f, indent=2, sort_keys=True)
        f.write("\n")
    enc = [(n, R.encode_tensor(lora[n].numpy(), case["store"])) for n in lora]
    R.write_safetensors(os.path.join(path, "adapter_model.safetensors"), enc)


def read_adapter(path, cfg):
    """(config dict, key -> float64 tensor), checking the names and shapes against the base."""
    with open(os.path.join(path, "adapter_config.json")) as f:
        c = json.load(f)
    t = R.read_safetensors(os.path.join(path, "adapter_model.safetensors"))
    want = dict(R.lora_shapes(cfg, c["target_modules"], c["r"]))
    assert set(t) == set(want), sorted(set(t) ^ set(want))
    lora = {}
    for n, (_, arr) in t.items():
        assert tuple(arr.shape) == tuple(want[n]), n
        lora[n] = torch.from_numpy(np.array(arr)).double()
    return c, lora


def make_batch(cfg, case, seed):
    """tokens, targets (int64 [B,T]), loss_mask (float64 [B,T]), adapter_mask (float64 [B,T])."""
    rng = np.random.default_rng(seed)
    lengths, prompts, T = case["lengths"], case["prompts"], case["T"]
    B = len(lengths)
    tokens = np.zeros((B, T), np.int64)
    targets = np.zeros((B, T), np.int64)
    loss_mask = np.zeros((B, T), np.float64)
    amask = np.ones((B, T), np.float64)
    for b, (n, p) in enumerate(zip(lengths, prompts)):
        assert 1 <= p <= n - 2, "each row needs a prompt and at least two response tokens"
        tokens[b, :n] = rng.integers(1, cfg.V, size=n)    # 0 is reserved for padding
        targets[b, :n - 1] = tokens[b, 1:n]
        if case["masked"]:
            loss_mask[b, p - 1:n - 1] = 1.0                # positions predicting response tokens
            amask[b] = 0.0
            amask[b, p:n] = 1.0                             # the adapter reads response tokens only
        else:
            loss_mask[b, :n - 1] = 1.0
    return tokens, targets, loss_mask, amask


def loss_of(cfg, w, lora, scale, amask, tokens, targets, mask, inputs_embeds=None):
    with torch.no_grad():
        lo = R.forward_lora(cfg, w, lora, scale, amask, tokens=tokens, inputs_embeds=inputs_embeds)
        return R.masked_loss(lo, targets, mask).item()


def check_grads(cfg, w, lora, scale, amask, grads, emb, emb_grad, tokens, targets, mask, seed):
    """The largest-|grad| entry of several adapter tensors and a random entry of each, plus two
    inputs_embeds entries, against fourth-order float64 central differences. Returns the worst relative
    error; raises if an entry is off."""
    rng = np.random.default_rng(seed)
    chk = R.GradCheck()

    names = sorted(lora)
    for name in [names[i] for i in rng.choice(len(names), size=min(6, len(names)), replace=False)]:
        g = grads[name].view(-1)
        t = lora[name].view(-1)
        for i in (int(g.abs().argmax()), int(rng.integers(0, g.numel()))):
            chk.compare("%s[%d]" % (name, i), g[i].item(),
                        R.central_difference(t, i, lambda: loss_of(cfg, w, lora, scale, amask, tokens, targets, mask)))
    e = emb.detach().clone()
    ev = e.view(-1)
    for i in (int(emb_grad.abs().argmax()), int(rng.integers(0, ev.numel()))):
        chk.compare("inputs_embeds[%d]" % i, emb_grad.view(-1)[i].item(),
                    R.central_difference(ev, i, lambda: loss_of(cfg, w, lora, scale, amask, tokens, targets, mask,
                                                                inputs_embeds=e)))
    return chk.worst


def run_case(case, out_root):
    t_start = time.time()
    name = case["name"]
    tmp = R.case_tmp_dir(out_root, name)
    base_dir, ad_dir = os.path.join(tmp, "base"), os.path.join(tmp, "adapter")

    cfg = R.Config(case["cfg"])
    R.save_hf_dir(base_dir, case["cfg"], R.init_weights(cfg, case["seed"]), dtype="F32")
    cfg, w = R.load_hf_dir(base_dir, dtype=torch.float64)
    write_adapter(ad_dir, case, init_lora(cfg, case), "base")
    acfg, lora = read_adapter(ad_dir, cfg)                 # the reference computes from what was written
    r = acfg["r"]
    scale = acfg["lora_alpha"] / (math.sqrt(r) if acfg["use_rslora"] else r)

    tokens_np, targets_np, lmask_np, amask_np = make_batch(cfg, case, case["seed"] + 7)
    tokens, targets = torch.from_numpy(tokens_np), torch.from_numpy(targets_np)
    lmask, amask = torch.from_numpy(lmask_np), torch.from_numpy(amask_np)
    B, T = tokens.shape

    params = {n: t.clone().requires_grad_(True) for n, t in lora.items()}
    emb = R.embed(w, tokens).clone().requires_grad_(True)  # (B, T, C)
    logits = R.forward_lora(cfg, w, params, scale, amask, inputs_embeds=emb)
    loss = R.masked_loss(logits, targets, lmask)
    loss.backward()
    grads = {n: p.grad.detach() for n, p in params.items()}
    logits = logits.detach()

    # --- self-checks -------------------------------------------------------------------------------
    with torch.no_grad():
        base = R.forward(cfg, w, tokens=tokens)
        # (1) mask off everywhere: exactly the base model
        off = R.forward_lora(cfg, w, lora, scale, torch.zeros_like(amask), tokens=tokens)
        assert torch.equal(off, base), "a zero mask changed the logits by %g" % (off - base).abs().max()
        # (2) prompt positions of a masked case are the base model's; the response positions are not
        changed = 0.0
        for b, (n, p) in enumerate(zip(case["lengths"], case["prompts"])):
            if case["masked"]:
                d = (logits[b, :p] - base[b, :p]).abs().max().item()
                assert d < 1e-12, "masked adapter changed prompt logits by %g" % d
            changed = max(changed, (logits[b, p:n] - base[b, p:n]).abs().max().item())
        rel_change = changed / logits.abs().max().item()
        assert rel_change > 0.05, "the adapter barely changes the logits (%g)" % rel_change
        # (3) padding never reaches a valid position
        pad = 0.0
        for b, n in enumerate(case["lengths"]):
            lo = R.forward_lora(cfg, w, lora, scale, amask[b:b + 1, :n], tokens=tokens[b:b + 1, :n])
            pad = max(pad, (lo[0] - logits[b, :n]).abs().max().item())
        assert pad < 1e-12, "padding changed valid logits by %g" % pad
    # (4) the adapter on everywhere is the merged layer W + scale * B A (PEFT's merge), independently of
    #     how forward_lora applies it
    with torch.no_grad():
        merged = {n: t.clone() for n, t in w.items()}
        for l in range(cfg.L):
            for t in acfg["target_modules"]:
                sub = "self_attn" if t in R.LORA_TARGETS[:4] else "mlp"
                merged["model.layers.%d.%s.%s.weight" % (l, sub, t)] += (
                    scale * lora[R.lora_key(l, t, "B")] @ lora[R.lora_key(l, t, "A")])
        on = R.forward_lora(cfg, w, lora, scale, torch.ones_like(amask), tokens=tokens)
        merge_diff = ((R.forward(cfg, merged, tokens=tokens) - on).abs().max() / on.abs().max()).item()
        assert merge_diff < 1e-12, "adapter on everywhere differs from the merged model by %g" % merge_diff
    # (5) every adapter tensor gets a gradient, and the gradients match finite differences
    for n, g in grads.items():
        assert g.abs().max().item() > 0, "zero gradient for " + n
    fd_rel = check_grads(cfg, w, lora, scale, amask, grads, emb, emb.grad, tokens, targets, lmask,
                         case["seed"] + 11)

    # --- write -------------------------------------------------------------------------------------
    exp = [
        ("tokens", R.encode_tensor(tokens_np, "I32")),
        ("lengths", R.encode_tensor(np.array(case["lengths"]), "I32")),
        ("prompt_len", R.encode_tensor(np.array(case["prompts"]), "I32")),
        ("adapter_mask", R.encode_tensor(amask_np, "U8")),
        ("targets", R.encode_tensor(targets_np, "I32")),
        ("loss_mask", R.encode_tensor(lmask_np, "F32")),
        ("logits", R.encode_tensor(logits.numpy(), "F32")),
        ("loss", R.encode_tensor(np.array([loss.item()]), "F32")),
        ("grad.inputs_embeds", R.encode_tensor(emb.grad.numpy(), "F32")),
    ]
    for n, _ in R.lora_shapes(cfg, acfg["target_modules"], r):
        exp.append(("grad." + n, R.encode_tensor(grads[n].numpy(), "F32")))
    R.write_safetensors(os.path.join(tmp, "expected.safetensors"), exp)

    R.case_commit(out_root, name, tmp)
    print("%-19s L=%d C=%d NH=%d NKV=%d %s r=%d alpha=%g %s %s targets=%s %s B=%d T=%d loss=%.6f "
          "adapter_change=%.2f fd_maxrel=%.1e (%.2fs)"
          % (name, cfg.L, cfg.C, cfg.NH, cfg.NKV, "tied" if cfg.tied else "untied", r, acfg["lora_alpha"],
             "rslora" if acfg["use_rslora"] else "", "masked" if case["masked"] else "unmasked",
             ",".join(acfg["target_modules"]), case["store"], B, T, loss.item(), rel_change, fd_rel,
             time.time() - t_start))
    sys.stdout.flush()


if __name__ == "__main__":
    R.cases_main(__doc__, "make_lora_ref.py", CASES, run_case)
