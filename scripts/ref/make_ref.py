#!/usr/bin/python3
"""Reference checkpoints and expected outputs for the C transformer tests.

    /usr/bin/python3 scripts/ref/make_ref.py --out build/ref [--only CASE]

For each case writes OUT/<case>/:
    config.json, model.safetensors (or two shards + model.safetensors.index.json)   an HF model dir
    expected.safetensors    tokens I32 [B,T] (right-padded with 0), lengths I32 [B], targets I32 [B,T]
                            (tokens shifted left; 0 at the last valid position and on padding),
                            loss_mask F32 [B,T] (1 on 0..len-2, minus a few random positions),
                            logits F32 [B,T,V], loss F32 [1] = sum(mask*nll)/sum(mask),
                            grad.<hf name> F32 for every parameter (tied: embed grad has both uses),
                            grad.inputs_embeds F32 [B,T,C] (d loss / d embedding-lookup output),
                            logprobs F32 [B,T-1] (log p(tokens[b,i+1] | tokens[b,:i+1]); 0 on padding),
                            hidden F32 [B,T,C] (final-normed hidden states, the input of lm_head),
                            embed_mean, embed_last F32 [B,C] (each row's mean / last valid hidden state,
                            L2-normalised: sentence-transformers' pooling of an embedding model)
    score_input.jsonl       one {"tokens": [...]} per batch row, valid tokens only

Everything is computed in float64 from the weights as read back from the written files (so the bf16 case
uses the bf16-rounded weights) and stored as F32. Before writing, each case checks itself: gradients
against float64 central differences, padding invariance of the valid positions, and logprobs against the
loss; a failed check raises, so `make test` stops instead of comparing C code to a wrong reference.
"""

import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen2_ref as R  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))


def qwen2_config(V, C, FF, L, NH, NKV, theta, tied, dtype="float32", eps=1e-6):
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": C,
        "initializer_range": 0.02,
        "intermediate_size": FF,
        "max_position_embeddings": 128,
        "max_window_layers": L,
        "num_attention_heads": NH,
        "num_hidden_layers": L,
        "num_key_value_heads": NKV,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "sliding_window": 128,
        "tie_word_embeddings": tied,
        "torch_dtype": dtype,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": V,
    }


def llama_config(V, C, FF, L, NH, NKV, HS, theta, tied, eps=1e-5):
    # transformers-5 style: rope_parameters instead of rope_theta, "dtype" instead of "torch_dtype"
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "float32",
        "head_dim": HS,
        "hidden_act": "silu",
        "hidden_size": C,
        "initializer_range": 0.02,
        "intermediate_size": FF,
        "max_position_embeddings": 128,
        "mlp_bias": False,
        "num_attention_heads": NH,
        "num_hidden_layers": L,
        "num_key_value_heads": NKV,
        "pretraining_tp": 1,
        "rms_norm_eps": eps,
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "tie_word_embeddings": tied,
        "use_cache": True,
        "vocab_size": V,
    }


def qwen3_config(V, C, FF, L, NH, NKV, HS, theta, tied, dtype="float32", eps=1e-6):
    # Qwen3-0.6B's config.json, shrunk: Qwen2's fields, head_dim set apart from hidden_size / heads, no q/k/v biases
    c = qwen2_config(V, C, FF, L, NH, NKV, theta, tied, dtype=dtype, eps=eps)
    c.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": HS,
              "rope_scaling": None, "sliding_window": None})
    return c


CASES = [
    dict(name="qwen2_tied_f32", seed=101, store="F32", shards=1, lengths=[12, 9, 5], T=12,
         cfg=qwen2_config(V=96, C=32, FF=64, L=2, NH=4, NKV=2, theta=10000.0, tied=True)),
    dict(name="qwen2_untied_f32", seed=202, store="F32", shards=1, lengths=[7, 12, 10], T=12,
         cfg=qwen2_config(V=96, C=64, FF=128, L=2, NH=8, NKV=2, theta=1000000.0, tied=False)),
    dict(name="qwen2_bf16", seed=303, store="BF16", shards=1, lengths=[10, 4, 8], T=10,
         cfg=qwen2_config(V=96, C=32, FF=96, L=2, NH=4, NKV=1, theta=10000.0, tied=True,
                          dtype="bfloat16")),
    dict(name="qwen2_sharded", seed=404, store="F32", shards=2, lengths=[11, 12, 3], T=12,
         cfg=qwen2_config(V=96, C=48, FF=128, L=2, NH=6, NKV=2, theta=10000.0, tied=False)),
    dict(name="llama_headdim", seed=505, store="F32", shards=1, lengths=[12, 6, 9], T=12,
         cfg=llama_config(V=96, C=48, FF=112, L=2, NH=4, NKV=2, HS=16, theta=500000.0, tied=False)),
    dict(name="qwen3_untied_f32", seed=606, store="F32", shards=1, lengths=[12, 8, 11], T=12,
         cfg=qwen3_config(V=96, C=32, FF=96, L=2, NH=4, NKV=2, HS=16, theta=1000000.0, tied=False)),
    dict(name="qwen3_bf16", seed=707, store="BF16", shards=1, lengths=[9, 10, 4], T=10,
         cfg=qwen3_config(V=96, C=48, FF=96, L=2, NH=4, NKV=1, HS=8, theta=1000000.0, tied=True,
                          dtype="bfloat16")),
    dict(name="qwen3_sharded", seed=808, store="F32", shards=2, lengths=[6, 12, 10], T=12,
         cfg=qwen3_config(V=96, C=32, FF=64, L=2, NH=4, NKV=2, HS=16, theta=10000.0, tied=False)),
]


def make_batch(cfg, lengths, T, seed):
    """tokens, targets (int64 [B,T]) and loss_mask (float64 [B,T]) for right-padded rows."""
    rng = np.random.default_rng(seed)
    B = len(lengths)
    tokens = np.zeros((B, T), np.int64)
    targets = np.zeros((B, T), np.int64)
    mask = np.zeros((B, T), np.float64)
    for b, n in enumerate(lengths):
        tokens[b, :n] = rng.integers(1, cfg.V, size=n)   # 0 is reserved for padding
        targets[b, :n - 1] = tokens[b, 1:n]
        mask[b, :n - 1] = 1.0
    # zero a few valid positions so the C loss has to honour the mask, not just the lengths
    valid = np.argwhere(mask > 0)
    for i in rng.choice(len(valid), size=3, replace=False):
        b, t = valid[i]
        if mask[b].sum() > 1:
            mask[b, t] = 0.0
    return tokens, targets, mask


def loss_of(cfg, w, tokens, targets, mask, inputs_embeds=None):
    with torch.no_grad():
        logits = R.forward(cfg, w, tokens=tokens, inputs_embeds=inputs_embeds)
        return R.masked_loss(logits, targets, mask).item()


def check_grads(cfg, w, grads, emb, emb_grad, tokens, targets, mask, seed):
    """Largest-|grad| entry of several parameters, plus two inputs_embeds entries, against float64
    central differences. Returns the worst relative error; raises if any entry is off."""
    names = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
             "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
             "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
             "model.layers.1.post_attention_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
             "model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    if cfg.qkv_bias:
        names += ["model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias"]
    if not cfg.tied:
        names.append("lm_head.weight")
    chk = R.GradCheck()
    for name in names:
        g = grads[name]
        i = int(g.abs().argmax())
        t = w[name].view(-1)
        chk.compare("%s[%d]" % (name, i), g.view(-1)[i].item(),
                    R.central_difference(t, i, lambda: loss_of(cfg, w, tokens, targets, mask)))
    rng = np.random.default_rng(seed)
    e = emb.detach().clone()
    ev = e.view(-1)
    B, T, C = e.shape
    b = int(rng.integers(0, B))
    t0 = int(rng.integers(0, max(1, int(mask[b].nonzero()[-1]))))   # a position before the last loss
    for i in [int(emb_grad.abs().argmax()), (b * T + t0) * C + int(rng.integers(0, C))]:
        chk.compare("inputs_embeds[%d]" % i, emb_grad.view(-1)[i].item(),
                    R.central_difference(ev, i, lambda: loss_of(cfg, w, tokens, targets, mask, inputs_embeds=e)))
    return chk.worst


def run_case(case, out_root):
    t_start = time.time()
    name = case["name"]
    tmp = R.case_tmp_dir(out_root, name)

    cfg = R.Config(case["cfg"])
    w0 = R.init_weights(cfg, case["seed"])
    R.save_hf_dir(tmp, case["cfg"], w0, dtype=case["store"], shards=case["shards"])
    cfg, w = R.load_hf_dir(tmp, dtype=torch.float64)       # the reference computes from what was written
    if case["store"] == "BF16":
        for n in w:
            ref = w0[n].float().bfloat16().double()           # torch's own bf16 rounding as a cross-check
            assert torch.equal(w[n], ref), "bf16 round trip of " + n

    tokens_np, targets_np, mask_np = make_batch(cfg, case["lengths"], case["T"], case["seed"] + 7)
    tokens = torch.from_numpy(tokens_np)
    targets = torch.from_numpy(targets_np)
    mask = torch.from_numpy(mask_np)
    lengths = torch.tensor(case["lengths"])
    B, T = tokens.shape

    params = {n: t.clone().requires_grad_(True) for n, t in w.items()}
    emb = R.embed(params, tokens)                           # (B, T, C)
    emb.retain_grad()
    logits, hidden = R.forward(cfg, params, inputs_embeds=emb, return_hidden=True)
    loss = R.masked_loss(logits, targets, mask)
    loss.backward()
    grads = {n: p.grad.detach() for n, p in params.items()}
    logits = logits.detach()
    logprobs = R.token_logprobs(logits, tokens, lengths)   # (B, T-1)

    # --- self-checks -------------------------------------------------------------------------------
    # (1) the loss agrees with the score output where the mask is on
    m = mask[:, :-1]
    loss2 = -(logprobs * m).sum() / mask.sum()
    assert abs(loss2.item() - loss.item()) < 1e-12 * max(1.0, abs(loss.item())), (loss2, loss)
    # (2) padding never reaches a valid position: each row alone gives the same logits
    pad_diff = 0.0
    with torch.no_grad():
        for b, n in enumerate(case["lengths"]):
            lo = R.forward(cfg, w, tokens=tokens[b:b + 1, :n])
            pad_diff = max(pad_diff, (lo[0] - logits[b, :n]).abs().max().item())
    assert pad_diff < 1e-12, "padding changed valid logits by %g" % pad_diff
    # (3) gradients against finite differences
    fd_rel = check_grads(cfg, w, grads, emb, emb.grad, tokens, targets, mask, case["seed"] + 11)
    # (4) how far a plain fp32 forward (HF math, fp32 softmax/norms) is from the float64 one: a floor
    #     for the tolerances the C tests can use
    with torch.no_grad():
        w32 = {n: t.float() for n, t in w.items()}
        lo32 = R.forward(cfg, w32, tokens=tokens).double()
        f32_rel = ((lo32 - logits).abs().max() / logits.abs().max()).item()

    # --- write -------------------------------------------------------------------------------------
    exp = [
        ("tokens", R.encode_tensor(tokens_np, "I32")),
        ("lengths", R.encode_tensor(np.array(case["lengths"]), "I32")),
        ("targets", R.encode_tensor(targets_np, "I32")),
        ("loss_mask", R.encode_tensor(mask_np, "F32")),
        ("logits", R.encode_tensor(logits.numpy(), "F32")),
        ("loss", R.encode_tensor(np.array([loss.item()]), "F32")),
        ("logprobs", R.encode_tensor(logprobs.numpy(), "F32")),
        ("hidden", R.encode_tensor(hidden.detach().numpy(), "F32")),
        ("embed_mean", R.encode_tensor(R.pool_embeddings(hidden.detach(), lengths, False).numpy(), "F32")),
        ("embed_last", R.encode_tensor(R.pool_embeddings(hidden.detach(), lengths, True).numpy(), "F32")),
        ("grad.inputs_embeds", R.encode_tensor(emb.grad.numpy(), "F32")),
    ]
    for n, _ in R.param_shapes(cfg):
        exp.append(("grad." + n, R.encode_tensor(grads[n].numpy(), "F32")))
    R.write_safetensors(os.path.join(tmp, "expected.safetensors"), exp)
    with open(os.path.join(tmp, "score_input.jsonl"), "w") as f:
        for b, n in enumerate(case["lengths"]):
            f.write(json.dumps({"tokens": [int(x) for x in tokens_np[b, :n]]}) + "\n")

    R.case_commit(out_root, name, tmp)
    print("%-17s %s V=%d C=%d L=%d NH=%d NKV=%d HS=%d FF=%d %s %s%s B=%d T=%d lens=%s loss=%.6f "
          "|logits|max=%.2f fd_maxrel=%.1e pad_maxdiff=%.1e fp32_vs_f64=%.1e (%.2fs)"
          % (name, cfg.model_type, cfg.V, cfg.C, cfg.L, cfg.NH, cfg.NKV, cfg.HS, cfg.FF,
             "tied" if cfg.tied else "untied", case["store"],
             " shards=%d" % case["shards"] if case["shards"] > 1 else "", B, T,
             ",".join(map(str, case["lengths"])), loss.item(), logits.abs().max().item(),
             fd_rel, pad_diff, f32_rel, time.time() - t_start))
    sys.stdout.flush()


if __name__ == "__main__":
    R.cases_main(__doc__, "make_ref.py", CASES, run_case)
