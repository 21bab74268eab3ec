"""Independent plain-torch reference of Hugging Face transformers' Qwen2 / Qwen3 / Llama causal LM.

Written from the transformers modelling code (Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM), without importing
`transformers`: the C transformer is tested against this file, so it must stay small enough to check by eye.

    x = embed_tokens[tokens]                                                   (B, T, C)
    per layer:
        h = rms_norm(x) * input_layernorm            (norm math in >= fp32, like HF)
        q, k, v = h @ Wq^T + bq, h @ Wk^T + bk, h @ Wv^T + bv                  (q/k/v bias: qwen2 always,
                                                                               qwen3 / llama if attention_bias)
        q, k = rms_norm(q) * q_norm, rms_norm(k) * k_norm   (qwen3 only: each head over its HS values)
        q, k = rope(q), rope(k)                       (NeoX rotate_half, [freqs, freqs] layout)
        a = softmax(q k^T / sqrt(HS) + causal) v      (GQA: query head h reads kv head h // (NH/NKV);
                                                       softmax in >= fp32)
        x = x + a @ Wo^T                              (o bias only for qwen3 / llama with attention_bias)
        h = rms_norm(x) * post_attention_layernorm
        x = x + down(silu(gate(h)) * up(h))
    logits = rms_norm(x) * norm @ lm_head^T           (lm_head = embed_tokens when tied)

Everything runs in the dtype of the weights handed in (make_ref.py uses float64 so the reference is more
exact than the fp32 C code it checks). Sequences in a batch are right-padded; causal attention means the
padding never reaches a valid position, so no attention mask beyond the causal one is needed.

The module also holds a tiny safetensors reader/writer (struct + json) and HF model-dir save/load,
so the reference does not depend on the `safetensors` package either, and what the two generators
(make_ref.py, make_lora_ref.py) share: finite-difference gradient checks, one output dir per case, the
command line.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------------
# config


def read_rope_theta(cfg):
    """rope_theta (transformers <= 4.x) or rope_parameters.rope_theta (transformers 5)."""
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type", "default")) != "default":
        raise ValueError("rope_scaling %r not supported by the reference" % (rs,))
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    rp = cfg.get("rope_parameters") or {}
    if "rope_theta" in rp:
        rtype = rp.get("rope_type", rp.get("type", "default"))
        if rtype != "default":
            raise ValueError("rope_type %r not supported by the reference" % rtype)
        return float(rp["rope_theta"])
    return 10000.0  # the transformers default


class Config:
    """The fields of an HF config.json that the forward needs, in llm.c letters."""

    def __init__(self, d):
        self.raw = d
        self.model_type = d["model_type"]
        if self.model_type not in ("qwen2", "qwen3", "llama"):
            raise ValueError("model_type %r: expected qwen2, qwen3 or llama" % self.model_type)
        self.V = int(d["vocab_size"])
        self.C = int(d["hidden_size"])
        self.FF = int(d["intermediate_size"])
        self.L = int(d["num_hidden_layers"])
        self.NH = int(d["num_attention_heads"])
        self.NKV = int(d.get("num_key_value_heads") or self.NH)
        hd = d.get("head_dim")
        self.HS = int(hd) if hd is not None else self.C // self.NH
        self.theta = read_rope_theta(d)
        self.eps = float(d.get("rms_norm_eps", 1e-6))
        self.tied = bool(d.get("tie_word_embeddings", False))
        self.max_pos = int(d.get("max_position_embeddings", 32768))
        self.dtype = d.get("torch_dtype", d.get("dtype", "float32"))
        if self.model_type == "qwen2":
            # Qwen2Attention: q/k/v Linear(bias=True), o_proj bias=False, MLP without bias.
            self.qkv_bias, self.o_bias, self.mlp_bias = True, False, False
        else:
            # Qwen3Attention / LlamaAttention: every projection, o_proj included, takes bias=config.attention_bias.
            ab = bool(d.get("attention_bias", False))
            self.qkv_bias, self.o_bias, self.mlp_bias = ab, ab, bool(d.get("mlp_bias", False))
        self.qk_norm = self.model_type == "qwen3"  # Qwen3Attention: q_norm, k_norm (RMSNorm over head_dim)
        if self.NH % self.NKV != 0:
            raise ValueError("num_attention_heads %d not a multiple of num_key_value_heads %d"
                             % (self.NH, self.NKV))
        if self.HS % 2 != 0:
            raise ValueError("head_dim %d must be even for RoPE" % self.HS)


def param_shapes(cfg):
    """[(hf name, shape)] for every parameter, in HF order."""
    C, FF, V, HS, NH, NKV = cfg.C, cfg.FF, cfg.V, cfg.HS, cfg.NH, cfg.NKV
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg.L):
        p = "model.layers.%d." % l
        out.append((p + "input_layernorm.weight", (C,)))
        out.append((p + "self_attn.q_proj.weight", (NH * HS, C)))
        if cfg.qkv_bias:
            out.append((p + "self_attn.q_proj.bias", (NH * HS,)))
        out.append((p + "self_attn.k_proj.weight", (NKV * HS, C)))
        if cfg.qkv_bias:
            out.append((p + "self_attn.k_proj.bias", (NKV * HS,)))
        out.append((p + "self_attn.v_proj.weight", (NKV * HS, C)))
        if cfg.qkv_bias:
            out.append((p + "self_attn.v_proj.bias", (NKV * HS,)))
        out.append((p + "self_attn.o_proj.weight", (C, NH * HS)))
        if cfg.o_bias:
            out.append((p + "self_attn.o_proj.bias", (C,)))
        if cfg.qk_norm:
            out.append((p + "self_attn.q_norm.weight", (HS,)))
            out.append((p + "self_attn.k_norm.weight", (HS,)))
        out.append((p + "post_attention_layernorm.weight", (C,)))
        out.append((p + "mlp.gate_proj.weight", (FF, C)))
        out.append((p + "mlp.up_proj.weight", (FF, C)))
        out.append((p + "mlp.down_proj.weight", (C, FF)))
        if cfg.mlp_bias:
            out.append((p + "mlp.gate_proj.bias", (FF,)))
            out.append((p + "mlp.up_proj.bias", (FF,)))
            out.append((p + "mlp.down_proj.bias", (C,)))
    out.append(("model.norm.weight", (C,)))
    if not cfg.tied:
        out.append(("lm_head.weight", (V, C)))
    return out


def init_weights(cfg, seed, std=0.2, dtype=torch.float64):
    """Random weights large enough that logits are far from uniform.
    Linear weights and embeddings ~ N(0, std), norm weights 1 + N(0, 0.1), biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in param_shapes(cfg):
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            t = 0.1 * r
        else:
            t = std * r
        w[name] = t.to(dtype)
    return w


# ---------------------------------------------------------------------------------------------------
# forward


def _at_least_f32(x):
    return x if x.dtype == torch.float64 else x.float()


def rms_norm(x, weight, eps):
    # HF: hidden.to(float32); var = mean(h^2); h * rsqrt(var + eps); weight * h.to(input dtype).
    # float64 is kept as float64 here (HF would downcast it to float32).
    h = _at_least_f32(x)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def linear(x, weight, bias=None):
    y = x @ weight.t()
    return y if bias is None else y + bias


def rope_cos_sin(cfg, T, dtype, device=None):
    """cos, sin (T, HS): inv_freq_i = 1 / theta^(2i/HS), angles pos * inv_freq, duplicated [f, f]."""
    HS = cfg.HS
    inv_freq = 1.0 / (cfg.theta ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))  # (HS/2,)
    pos = torch.arange(T, dtype=torch.float64)
    freqs = pos[:, None] * inv_freq[None, :]                                               # (T, HS/2)
    emb = torch.cat([freqs, freqs], dim=-1)                                                # (T, HS)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):
    # x (B, H, T, HS); cos, sin (T, HS)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    # (B, NKV, T, HS) -> (B, NKV * n_rep, T, HS); head h of the result is kv head h // n_rep
    if n_rep == 1:
        return x
    B, NKV, T, HS = x.shape
    return x[:, :, None, :, :].expand(B, NKV, n_rep, T, HS).reshape(B, NKV * n_rep, T, HS)


def split_heads(cfg, w, p, q, k, v):
    """q (B, T, NH*HS), k, v (B, T, NKV*HS) -> (B, NH, T, HS), (B, NKV, T, HS) x 2; Qwen3 normalises each
    q and k head first: q_norm(q_proj(h).view(..., HS)), the same for k."""
    B, T, _ = q.shape
    q = q.view(B, T, cfg.NH, cfg.HS)
    k = k.view(B, T, cfg.NKV, cfg.HS)
    if cfg.qk_norm:
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.eps)
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.eps)
    return q.transpose(1, 2), k.transpose(1, 2), v.view(B, T, cfg.NKV, cfg.HS).transpose(1, 2)


def attention(cfg, w, p, h, cos, sin):
    B, T, _ = h.shape
    NH, NKV, HS = cfg.NH, cfg.NKV, cfg.HS
    q = linear(h, w[p + "self_attn.q_proj.weight"], w.get(p + "self_attn.q_proj.bias"))
    k = linear(h, w[p + "self_attn.k_proj.weight"], w.get(p + "self_attn.k_proj.bias"))
    v = linear(h, w[p + "self_attn.v_proj.weight"], w.get(p + "self_attn.v_proj.bias"))
    q, k, v = split_heads(cfg, w, p, q, k, v)   # (B, NH, T, HS), (B, NKV, T, HS) x 2
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    k = repeat_kv(k, NH // NKV)
    v = repeat_kv(v, NH // NKV)
    att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HS))                 # (B, NH, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=h.device).triu(1)    # True above the diagonal
    att = att.masked_fill(causal, float("-inf"))
    att = torch.softmax(_at_least_f32(att), dim=-1).to(q.dtype)
    y = att @ v                                                             # (B, NH, T, HS)
    y = y.transpose(1, 2).reshape(B, T, NH * HS)
    return linear(y, w[p + "self_attn.o_proj.weight"], w.get(p + "self_attn.o_proj.bias"))


def mlp(w, p, h):
    gate = linear(h, w[p + "mlp.gate_proj.weight"], w.get(p + "mlp.gate_proj.bias"))
    up = linear(h, w[p + "mlp.up_proj.weight"], w.get(p + "mlp.up_proj.bias"))
    return linear(torch.nn.functional.silu(gate) * up, w[p + "mlp.down_proj.weight"],
                  w.get(p + "mlp.down_proj.bias"))


def embed(w, tokens):
    return w["model.embed_tokens.weight"][tokens]


def forward(cfg, w, tokens=None, inputs_embeds=None, return_hidden=False):
    """logits (B, T, V) from tokens (B, T) int64, or from inputs_embeds (B, T, C).
    With return_hidden also the final-normed hidden states (B, T, C)."""
    x = inputs_embeds if inputs_embeds is not None else embed(w, tokens)   # (B, T, C)
    B, T, _ = x.shape
    cos, sin = rope_cos_sin(cfg, T, x.dtype, x.device)
    for l in range(cfg.L):
        p = "model.layers.%d." % l
        x = x + attention(cfg, w, p, rms_norm(x, w[p + "input_layernorm.weight"], cfg.eps), cos, sin)
        x = x + mlp(w, p, rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.eps))
    h = rms_norm(x, w["model.norm.weight"], cfg.eps)
    head = w["model.embed_tokens.weight"] if cfg.tied else w["lm_head.weight"]
    logits = h @ head.t()                                                  # (B, T, V)
    return (logits, h) if return_hidden else logits


def pool_embeddings(hidden, lengths, last):
    """sentence-transformers' Pooling then Normalize on right-padded rows: each row's mean over its valid
    positions (pooling_mode_mean_tokens) or its last valid position (pooling_mode_lasttoken), L2-normalised.
    hidden (B, T, C) final-normed hidden states (HF's last_hidden_state) -> (B, C)."""
    T = hidden.shape[1]
    valid = (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]).to(hidden.dtype)   # (B, T)
    if last:
        pooled = hidden[torch.arange(hidden.shape[0]), torch.as_tensor(lengths) - 1]
    else:
        pooled = (hidden * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)
    return torch.nn.functional.normalize(pooled, p=2, dim=-1)


def masked_loss(logits, targets, loss_mask):
    """sum(mask * nll) / sum(mask); logits (B, T, V), targets (B, T) int64, loss_mask (B, T)."""
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, targets[..., None])[..., 0]                    # (B, T)
    return (nll * loss_mask).sum() / loss_mask.sum()


def token_logprobs(logits, tokens, lengths):
    """(B, T-1): log p(tokens[b, i+1] | tokens[b, :i+1]), 0 where i+1 >= lengths[b]."""
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    lp = logp.gather(-1, tokens[:, 1:, None])[..., 0]
    T = tokens.shape[1]
    valid = torch.arange(1, T)[None, :] < torch.as_tensor(lengths)[:, None]
    return torch.where(valid, lp, torch.zeros_like(lp))


# ---------------------------------------------------------------------------------------------------
# safetensors (own reader/writer: 8-byte LE header length, JSON header padded with spaces to 8 bytes)

_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
       "I16": np.int16, "I8": np.int8, "U8": np.uint8}
_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bf16 bits, round to nearest even (what torch's .bfloat16() does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode_tensor(a, dtype):
    """(dtype, shape, raw little-endian bytes) for a numpy array stored as dtype."""
    a = np.asarray(a)
    if dtype == "BF16":
        raw = f32_to_bf16_bits(a.astype(np.float32)).astype("<u2").tobytes()
    else:
        raw = a.astype(np.dtype(_NP[dtype]).newbyteorder("<")).tobytes()
    return dtype, list(a.shape), raw


def write_safetensors(path, tensors, metadata=None):
    """tensors: list or dict of name -> (dtype, shape, raw bytes) (see encode_tensor); order is kept.
    Written to path.tmp and renamed, so a reader never sees half a file."""
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    header = {"__metadata__": metadata or {"format": "pt"}}
    off = 0
    for name, (dtype, shape, raw) in items:
        n = _SIZE[dtype] * int(np.prod(shape, dtype=np.int64))
        assert n == len(raw), name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, (_, _, raw) in items:
            f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return off


def read_safetensors(path):
    """name -> (dtype string, numpy array); BF16 comes back as float32 holding the exact bf16 values."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, shape, (a, b) = info["dtype"], info["shape"], info["data_offsets"]
        raw = data[base + a: base + b]
        if dt == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_NP[dt]).newbyteorder("<")).astype(_NP[dt])
        out[name] = (dt, arr.reshape(shape))
    return out


# ---------------------------------------------------------------------------------------------------
# HF model dirs


def save_hf_dir(path, cfg_dict, weights, dtype="F32", shards=1):
    """config.json + model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json.
    weights: name -> torch tensor (any float dtype); stored as dtype (F32 or BF16)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
        f.write("\n")
    names = list(weights.keys())
    enc = [(n, encode_tensor(weights[n].detach().cpu().double().numpy(), dtype)) for n in names]
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), enc)
        return
    # contiguous split into shards of roughly equal byte size, in HF parameter order
    total = sum(len(e[1][2]) for e in enc)
    groups, cur, acc = [], [], 0
    for item in enc:
        cur.append(item)
        acc += len(item[1][2])
        if acc >= total * (len(groups) + 1) / shards and len(groups) < shards - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    assert len(groups) == shards and all(groups), "too few tensors for %d shards" % shards
    weight_map = {}
    for i, g in enumerate(groups):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        write_safetensors(os.path.join(path, fname), g)
        for n, _ in g:
            weight_map[n] = fname
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def load_hf_dir(path, dtype=torch.float64):
    """(Config, name -> torch tensor of dtype) from an HF model dir (single file or sharded)."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = Config(json.load(f))
    idx = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for fn in files:
        for name, (_, arr) in read_safetensors(os.path.join(path, fn)).items():
            w[name] = torch.from_numpy(np.array(arr)).to(dtype)
    for name, shape in param_shapes(cfg):
        if name not in w:
            raise ValueError("%s: missing tensor %s" % (path, name))
        if tuple(w[name].shape) != tuple(shape):
            raise ValueError("%s: %s has shape %s, expected %s" % (path, name, tuple(w[name].shape), shape))
    extra = set(w) - {n for n, _ in param_shapes(cfg)}
    if extra:
        raise ValueError("%s: unexpected tensors %s" % (path, sorted(extra)))
    return cfg, w


# ---------------------------------------------------------------------------------------------------
# LoRA adapters (PEFT layout) with the masked rule


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_key(layer, target, ab):
    """PEFT's saved name: base_model.model.model.layers.{l}.{self_attn|mlp}.{target}.lora_{A|B}.weight"""
    sub = "self_attn" if target in LORA_TARGETS[:4] else "mlp"
    return "base_model.model.model.layers.%d.%s.%s.lora_%s.weight" % (layer, sub, target, ab)


def lora_shapes(cfg, targets, r):
    """[(key, shape)]: A (r, in), B (out, r) for each layer and targeted module, in layer/target order."""
    q, kv = cfg.NH * cfg.HS, cfg.NKV * cfg.HS
    io = {"q_proj": (cfg.C, q), "k_proj": (cfg.C, kv), "v_proj": (cfg.C, kv), "o_proj": (q, cfg.C),
          "gate_proj": (cfg.C, cfg.FF), "up_proj": (cfg.C, cfg.FF), "down_proj": (cfg.FF, cfg.C)}
    out = []
    for l in range(cfg.L):
        for t in LORA_TARGETS:
            if t in targets:
                fan_in, fan_out = io[t]
                out.append((lora_key(l, t, "A"), (r, fan_in)))
                out.append((lora_key(l, t, "B"), (fan_out, r)))
    return out


def forward_lora(cfg, w, lora, scale, adapter_mask, tokens=None, inputs_embeds=None):
    """forward() with a LoRA adapter under the masked rule: each adapted linear layer computes
        y = x W^T + b + adapter_mask[..., None] * scale * (x A^T) B^T
    so the adapter changes nothing at input positions whose mask is 0 (and no position that only
    sees such positions). lora: lora_key -> tensor (untargeted modules absent); adapter_mask (B, T)
    0/1 in the weights' dtype. The same ops in the same order as forward(), so a mask of zeros gives
    forward()'s logits exactly."""
    m = adapter_mask[..., None]

    def lin(x, l, sub, target):
        p = "model.layers.%d.%s.%s." % (l, sub, target)
        y = linear(x, w[p + "weight"], w.get(p + "bias"))
        a = lora.get(lora_key(l, target, "A"))
        if a is not None:
            y = y + m * (scale * ((x @ a.t()) @ lora[lora_key(l, target, "B")].t()))
        return y

    x = inputs_embeds if inputs_embeds is not None else embed(w, tokens)   # (B, T, C)
    B, T, _ = x.shape
    NH, NKV, HS = cfg.NH, cfg.NKV, cfg.HS
    cos, sin = rope_cos_sin(cfg, T, x.dtype, x.device)
    for l in range(cfg.L):
        p = "model.layers.%d." % l
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.eps)
        q, k, v = split_heads(cfg, w, p, lin(h, l, "self_attn", "q_proj"), lin(h, l, "self_attn", "k_proj"),
                              lin(h, l, "self_attn", "v_proj"))
        q = apply_rope(q, cos, sin)
        k = repeat_kv(apply_rope(k, cos, sin), NH // NKV)
        v = repeat_kv(v, NH // NKV)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HS))
        causal = torch.ones(T, T, dtype=torch.bool, device=h.device).triu(1)
        att = torch.softmax(_at_least_f32(att.masked_fill(causal, float("-inf"))), dim=-1).to(q.dtype)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + lin(y, l, "self_attn", "o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
        g = lin(h, l, "mlp", "gate_proj")
        u = lin(h, l, "mlp", "up_proj")
        x = x + lin(torch.nn.functional.silu(g) * u, l, "mlp", "down_proj")
    h = rms_norm(x, w["model.norm.weight"], cfg.eps)
    head = w["model.embed_tokens.weight"] if cfg.tied else w["lm_head.weight"]
    return h @ head.t()                                                    # (B, T, V)


# ---------------------------------------------------------------------------------------------------
# what make_ref.py and make_lora_ref.py share

def central_difference(flat, i, f, h=1e-4):
    """d f / d flat[i], fourth-order central difference: truncation O(h^4) ~ 1e-16, rounding ~ 1e-16 / h.
    flat[i] is restored afterwards."""
    old = flat[i].item()
    vals = []
    for k in (-2, -1, 1, 2):
        flat[i] = old + k * h
        vals.append(f())
    flat[i] = old
    return (vals[0] - 8 * vals[1] + 8 * vals[2] - vals[3]) / (12 * h)


class GradCheck:
    """Analytic gradient entries against finite differences; raises on the first that is off. worst is the
    largest relative error seen."""

    def __init__(self):
        self.worst = 0.0

    def compare(self, what, an, num):
        err = abs(num - an)
        self.worst = max(self.worst, err / max(abs(an), 1e-12))
        if err > 1e-8 * abs(an) + 1e-11:
            raise AssertionError("gradient check %s: analytic %.12g, finite difference %.12g" % (what, an, num))


def case_tmp_dir(out_root, name):
    """A fresh OUT/.<name>.tmp to write a case into; case_commit then puts it at OUT/<name>, so a failed
    self-check never leaves a half-written case behind."""
    tmp = os.path.join(out_root, "." + name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def case_commit(out_root, name, tmp):
    final = os.path.join(out_root, name)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def cases_main(doc, prog, cases, run_case):
    """A generator's command line: --out DIR [--only CASE]; run_case(case, out_dir) writes one case."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--only", help="one case: " + ", ".join(c["name"] for c in cases))
    args = ap.parse_args()
    todo = cases
    if args.only:
        todo = [c for c in cases if c["name"] == args.only]
        if not todo:
            sys.exit("%s: unknown case %r (have %s)" % (prog, args.only, ", ".join(c["name"] for c in cases)))
    os.makedirs(args.out, exist_ok=True)
    for c in todo:
        run_case(c, args.out)
