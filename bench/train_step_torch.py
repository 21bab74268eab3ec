#!/usr/bin/python3
"""PyTorch peer for the C training step: one Qwen2-architecture forward + cross-entropy + backward.

    /usr/bin/python3 bench/train_step_torch.py --hidden 896 --layers 24 --heads 14 --kv-heads 2 \
        --intermediate 4864 --vocab 151936 --batch 1 --seq 256 --threads 2 --steps 3 --warmup 1
    ... --lora 16     LoRA SFT step: frozen base, rank-16 adapter (alpha 32) on all seven linears

Prints one line of JSON: {"impl": "pytorch", "mode": "full"|"lora", "tokens_per_s", "step_s" (median of
--steps timed steps), "torch", "threads", ...}.

The math is the one in scripts/ref/qwen2_ref.py (RMSNorm, q/k/v bias, NeoX RoPE, GQA causal attention,
SwiGLU, final norm, lm_head tied by default like Qwen2-0.5B), in fp32, written to be as fast as plain
eager torch reasonably gets so the comparison is fair to PyTorch:
- q/k/v are one Linear and gate/up are one Linear (same math, fewer and larger GEMMs);
- attention uses F.scaled_dot_product_attention when this torch has it (>= 2.0); otherwise a causal
  softmax where the query heads that share a kv head are stacked along the row axis, so K and V are
  never copied NH/NKV times (and their gradients never summed back);
- the embedding lookup's gradient is sparse (only the B*T rows used), added into the dense lm_head
  gradient when tied;
- grads are dropped between steps (zero_grad(set_to_none=True)); no optimizer step is timed.

With --lora R the base is frozen (requires_grad False everywhere, so autograd computes input gradients
only and never a base weight's gradient) and each of q/k/v/o/gate/up/down_proj gets PEFT's LoRA:
y = base(x) + (alpha/r) * B(A(dropout(x))), dropout 0 (PEFT's nn.Identity), alpha 2R, one A (r, in) and
one B (out, r) per module. PEFT starts B at zero; here B is small random so the adapter changes the loss
(the autograd work is the same). To stay a fast peer on the fused q/k/v and gate/up Linears, the
per-module A's of a fused Linear are concatenated into one GEMM (same math, same per-module
parameters) and their B's into one block-diagonal GEMM added to the fused output by one addmm.
--no-fuse gives the plain PEFT layout: separate Linears, each with its own A and B.
"""

import argparse
import json
import math
import os
import sys
import time


def _threads_from_argv():
    for i, s in enumerate(sys.argv):
        if s == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if s.startswith("--threads="):
            return s.split("=", 1)[1]
    return None


# torch.set_num_threads sizes torch's OpenMP pool but not the BLAS it calls (Debian's torch calls
# libblas.so.3 = OpenBLAS, which otherwise starts one thread per core), so pin the BLAS pool before
# torch loads it; otherwise --threads 1 would quietly run its GEMMs on every core.
# torch's elementwise ops run on an OpenMP pool and its GEMMs on OpenBLAS's own pthread pool; with
# both pools the size of the machine, OpenMP threads spinning after a parallel loop steal the cores
# the BLAS threads need, so let idle OpenMP threads sleep instead.
_N = _threads_from_argv()
if _N:
    for _k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_k, _N)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class LoRA(nn.Module):
    """PEFT's lora_A / lora_B of one target module: kaiming-uniform A, small random B."""

    def __init__(self, fan_in, fan_out, r):
        super().__init__()
        bound = 1.0 / math.sqrt(fan_in)   # kaiming_uniform_(a=sqrt(5)), PEFT's init of A
        self.A = nn.Parameter(torch.empty(r, fan_in).uniform_(-bound, bound))   # (r, in)
        self.B = nn.Parameter(torch.randn(fan_out, r) * 0.01)                    # (out, r)


class Block(nn.Module):
    def __init__(self, C, NH, NKV, HS, FF, eps, fuse, lora_r=0, lora_scale=0.0):
        super().__init__()
        self.NH, self.NKV, self.HS, self.FF, self.fuse = NH, NKV, HS, FF, fuse
        self.r, self.scale = lora_r, lora_scale
        self.input_layernorm = RMSNorm(C, eps)
        self.post_attention_layernorm = RMSNorm(C, eps)
        if fuse:
            self.qkv_proj = nn.Linear(C, (NH + 2 * NKV) * HS, bias=True)
            self.gate_up_proj = nn.Linear(C, 2 * FF, bias=False)
        else:
            self.q_proj = nn.Linear(C, NH * HS, bias=True)
            self.k_proj = nn.Linear(C, NKV * HS, bias=True)
            self.v_proj = nn.Linear(C, NKV * HS, bias=True)
            self.gate_proj = nn.Linear(C, FF, bias=False)
            self.up_proj = nn.Linear(C, FF, bias=False)
        self.o_proj = nn.Linear(NH * HS, C, bias=False)
        self.down_proj = nn.Linear(FF, C, bias=False)
        if lora_r:
            qd, kvd = NH * HS, NKV * HS
            shapes = {"q_proj": (C, qd), "k_proj": (C, kvd), "v_proj": (C, kvd), "o_proj": (qd, C),
                      "gate_proj": (C, FF), "up_proj": (C, FF), "down_proj": (FF, C)}
            self.lora = nn.ModuleDict({n: LoRA(i, o, lora_r) for n, (i, o) in shapes.items()})

    def proj(self, x, linear, names, widths):
        """linear(x) split into the modules `names` of widths `widths` (one Linear holds them fused),
        each plus its LoRA."""
        y = linear(x)                                            # (B, T, sum of widths)
        if not self.r:
            return y.split(widths, dim=-1)
        B, T, _ = x.shape
        x2, y2 = x.reshape(B * T, -1), y.view(B * T, -1)
        mods = [self.lora[n] for n in names]
        A = mods[0].A if len(mods) == 1 else torch.cat([m.A for m in mods])   # (k*r, in): one GEMM
        h = F.linear(x2, A)                                                     # (N, k*r)
        # + scale * h @ B^T with B = blockdiag(B_q, B_k, B_v) (or one B): one GEMM whose input
        # gradient passes straight to the fused output, instead of per-module addmms on column slices
        # whose gradients autograd would scatter into zero-filled full-width tensors and sum (slower);
        # the off-diagonal zeros cost (k-1)/k of a rank-r GEMM
        Bm = mods[0].B if len(mods) == 1 else torch.block_diag(*[m.B for m in mods])   # (sum of widths, k*r)
        return torch.addmm(y2, h, Bm.t(), alpha=self.scale).view(B, T, -1).split(widths, dim=-1)

    def attn(self, x, cos, sin, mask):
        B, T, _ = x.shape
        NH, NKV, HS = self.NH, self.NKV, self.HS
        G = NH // NKV
        if self.fuse:
            q, k, v = self.proj(x, self.qkv_proj, ("q_proj", "k_proj", "v_proj"), [NH * HS, NKV * HS, NKV * HS])
        else:
            (q,), (k,), (v,) = (self.proj(x, self.q_proj, ("q_proj",), [NH * HS]),
                                self.proj(x, self.k_proj, ("k_proj",), [NKV * HS]),
                                self.proj(x, self.v_proj, ("v_proj",), [NKV * HS]))
        q = q.view(B, T, NH, HS).transpose(1, 2)     # (B, NH, T, HS)
        k = k.view(B, T, NKV, HS).transpose(1, 2)    # (B, NKV, T, HS)
        v = v.view(B, T, NKV, HS).transpose(1, 2)    # (B, NKV, T, HS)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if HAS_SDPA:
            if G > 1:
                k = k.repeat_interleave(G, dim=1)
                v = v.repeat_interleave(G, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, NH, T, HS)
        else:
            # query head h reads kv head h // G: stack the G heads of a group along the rows
            qg = q.reshape(B, NKV, G * T, HS)
            att = torch.baddbmm(mask.expand(B * NKV, G * T, T), qg.reshape(B * NKV, G * T, HS),
                                k.reshape(B * NKV, T, HS).transpose(1, 2), alpha=1.0 / math.sqrt(HS))
            att = torch.softmax(att, dim=-1)
            y = torch.bmm(att, v.reshape(B * NKV, T, HS)).view(B, NH, T, HS)
        y = y.transpose(1, 2).reshape(B, T, NH * HS)
        return self.proj(y, self.o_proj, ("o_proj",), [x.shape[-1]])[0]

    def mlp(self, x):
        FF = self.FF
        if self.fuse:
            gate, up = self.proj(x, self.gate_up_proj, ("gate_proj", "up_proj"), [FF, FF])
        else:
            (gate,), (up,) = (self.proj(x, self.gate_proj, ("gate_proj",), [FF]),
                              self.proj(x, self.up_proj, ("up_proj",), [FF]))
        return self.proj(F.silu(gate) * up, self.down_proj, ("down_proj",), [x.shape[-1]])[0]

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        HS = a.head_dim or a.hidden // a.heads
        # sparse: the lookup's backward scatters into the rows it used instead of materialising a
        # zero (V, C) tensor and adding it (what a hand-written kernel does too)
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden, sparse=not a.dense_embed_grad)
        self.layers = nn.ModuleList([Block(a.hidden, a.heads, a.kv_heads, HS, a.intermediate, 1e-6,
                                           not a.no_fuse, a.lora, a.lora_alpha / max(a.lora, 1))
                                     for _ in range(a.layers)])
        self.norm = RMSNorm(a.hidden, 1e-6)
        self.lm_head = None if not a.untied else nn.Linear(a.hidden, a.vocab, bias=False)
        G, T = a.heads // a.kv_heads, a.seq
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
        freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos().float())   # (T, HS)
        self.register_buffer("sin", emb.sin().float())   # (T, HS)
        # HF's Qwen2 init (initializer_range 0.02), like the C side's model_build_random: normal(0, 0.02)
        # matrices, zero biases, unit norms (so both sides start at loss ~ln V)
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, 0.0, 0.02)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)
        causal = torch.full((T, T), float("-inf")).triu(1)
        self.register_buffer("mask", causal.repeat(G, 1).contiguous())   # (G*T, T), additive

    def forward(self, tokens, targets):
        x = self.embed_tokens(tokens)                    # (B, T, C)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin, self.mask)
        x = self.norm(x)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, head)                       # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description="PyTorch training-step peer (Qwen2 architecture)")
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--intermediate", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=0, help="default hidden/heads")
    ap.add_argument("--rope-theta", type=float, default=1000000.0)
    ap.add_argument("--untied", action="store_true", help="separate lm_head (default: tied, like Qwen2-0.5B)")
    ap.add_argument("--no-fuse", action="store_true", help="separate q/k/v and gate/up Linears")
    ap.add_argument("--dense-embed-grad", action="store_true",
                    help="dense embedding gradient (default: sparse rows, accumulated into the dense "
                         "lm_head gradient when tied)")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="LoRA step: frozen base + rank-R adapter on all seven linears (0 = full step)")
    ap.add_argument("--lora-alpha", type=float, default=0.0, help="default 2R")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.lora and not a.lora_alpha:
        a.lora_alpha = 2.0 * a.lora

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = Model(a)
    lora_params = [p for n, p in model.named_parameters() if ".lora." in n]
    if a.lora:
        for n, p in model.named_parameters():
            p.requires_grad_(".lora." in n)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
    targets = torch.randint(0, a.vocab, (a.batch, a.seq))

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        return loss.item()

    loss = None
    for _ in range(a.warmup):
        loss = step()
    if a.lora:
        # the frozen base must not have been differentiated, and every adapter matrix must have been
        assert all(p.grad is None for n, p in model.named_parameters() if ".lora." not in n)
        assert all(p.grad is not None for p in lora_params)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    # median: robust to the odd step that shares the cores with something else
    step_s = sorted(times)[len(times) // 2] if len(times) % 2 else \
        0.5 * (sorted(times)[len(times) // 2 - 1] + sorted(times)[len(times) // 2])
    print(json.dumps({
        "impl": "pytorch",
        "mode": "lora" if a.lora else "full",
        "lora_r": a.lora,
        "tokens_per_s": round(a.batch * a.seq / step_s, 2),
        "step_s": round(step_s, 5),
        "step_s_min": round(min(times), 5),
        "step_s_mean": round(sum(times) / len(times), 5),
        "steps": a.steps,
        "torch": torch.__version__,
        "threads": a.threads,
        "attention": "sdpa" if HAS_SDPA else "grouped_softmax",
        "fused": not a.no_fuse,
        "sparse_embed_grad": not a.dense_embed_grad,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "tied": not a.untied,
        "params": sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in lora_params),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "loss": round(loss, 4),
    }))


if __name__ == "__main__":
    main()
