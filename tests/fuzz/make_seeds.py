#!/usr/bin/env python3
"""Writes the seed corpora tests/fuzz/corpus/<target>/ (committed; rerun after changing a format).

Each target gets a few valid inputs, so the fuzzer starts deep inside the parser, and a few malformed
ones, one per kind of refusal. Files named regress-* are inputs that once crashed a target (added with
the fix, never generated here) and are kept. Multi-file inputs are joined with the harnesses' separator (FUZZ_SEP in
tests/fuzz/fuzz_common.h). Plain Python (json + struct): no torch, nothing from the build.

    python3 tests/fuzz/make_seeds.py            # from the project root
"""
import json
import os
import random
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
SEP = b"\n--ST--\n"
TINY = os.path.join(ROOT, "models", "tiny-base")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from make_tiny_tokenizer import QWEN_SPLIT  # noqa: E402  (the tiny tokenizer's own split regex)


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def js(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


# ---- safetensors ----

DT_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors(tensors, meta=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes). Offsets in the given order, header padded to 8."""
    header, data = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = js(header)
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def raw_header(text, data=b""):
    h = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors():
    t = "fuzz_safetensors"
    put(t, "valid-two", safetensors([("w", "F32", [2, 3], f32(range(6))), ("b", "I8", [4], b"\x01\x02\x03\x04")],
                                    {"format": "pt"}))
    put(t, "valid-empty", raw_header("{}"))
    put(t, "valid-dtypes", safetensors([("a", "F64", [], struct.pack("<d", 1.5)),
                                        ("h", "F16", [2, 1], b"\x00\x3c\x00\xc0"),
                                        ("g", "BF16", [1, 2], b"\x80\x3f\x00\x40"), ("u", "U8", [3], b"abc"),
                                        ("z", "F32", [0, 4], b""), ("i", "I64", [1], struct.pack("<q", -7))]))
    put(t, "valid-meta", safetensors([("x", "I32", [1, 1, 1, 2], struct.pack("<2i", 5, 6))],
                                     {"format": "pt", "note": "caf\u00e9 \u65e5"}))
    put(t, "bad-truncated", safetensors([("w", "F32", [4], f32([1, 2, 3, 4]))])[:-5])
    put(t, "bad-overlap", raw_header('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                                     '"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', b"abcd"))
    put(t, "bad-gap", raw_header('{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', b"abcd"))
    put(t, "bad-dtype", raw_header('{"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}}', b"ab"))
    put(t, "bad-duplicate", raw_header('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                       '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"ab"))
    put(t, "bad-meta", raw_header('{"__metadata__":{"k":1}}'))
    put(t, "bad-hugelen", struct.pack("<Q", 1 << 40) + b"{}")
    put(t, "bad-escape", raw_header('{"a\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"))


# ---- config.json ----

def tiny_config():
    with open(os.path.join(TINY, "config.json")) as f:
        return json.load(f)


def seeds_config():
    t = "fuzz_config"
    c = tiny_config()
    put(t, "tiny-base", js(c))
    put(t, "tiny-base-odd", js(c) + b" ")  # odd size: loaded for training
    llama = dict(c, model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False, mlp_bias=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, bos_token_id=1, eos_token_id=[2, 3],
                 dtype="bfloat16")
    put(t, "llama", js(llama))
    put(t, "untied", js(dict(c, tie_word_embeddings=False, eos_token_id=509, bos_token_id=None)))
    put(t, "quantized", js(dict(c, quantization_config={"quant_method": "ertrain", "weights": "q4g32",
                                                        "group_size": 32, "embeddings": "fp", "lm_head": "q8"})))
    put(t, "bad-gqa", js(dict(c, num_key_value_heads=3)))
    put(t, "bad-missing", js({k: v for k, v in c.items() if k != "hidden_size"}))
    put(t, "bad-rope-scaling", js(dict(c, rope_scaling={"type": "linear", "factor": 2.0})))
    put(t, "bad-headdim-odd", js(dict(c, head_dim=33)))
    put(t, "bad-type", js(dict(c, model_type="gpt2")))


# ---- quantization_config ----

def seeds_quant_config():
    t = "fuzz_quant_config"
    for i, q in enumerate([
        {"weights": "q8", "embeddings": "int8"},
        {"weights": "q4"},
        {"quant_method": "ertrain", "method": "rtn-lp", "weights": "q4g32", "group_size": 32, "embeddings": "fp",
         "lm_head": "q4g32", "transforms": "none", "bits_per_weight": 5.0},
        {"weights": "q2lut", "lm_head": "fp", "method": "kmeans-fisher"},
        {"weights": "q4lut", "lm_head": "q8", "method": "kmeans-qat"},
        {"weights": "q4", "embeddings": "int8", "lm_head": "q8"},
        {"weights": "q2lut", "lm_head": "q4", "sparse_per_row": 2},
    ]):
        # The harness sends sizes divisible by 3 to another layout's dir (the mismatch checks): one of each.
        text = js(dict({"quant_method": "ertrain"}, **q))
        put(t, "valid-%d" % i, text + b" " * (1 if len(text) % 3 == 0 else 0))
        put(t, "mismatch-%d" % i, text + b" " * (-len(text) % 3))
    er = {"quant_method": "ertrain"}
    put(t, "q4g64", js(dict(er, weights="q4g64", group_size=64)))
    put(t, "q4g128", js(dict(er, weights="q4g128", group_size=128)))
    put(t, "bad-group", js(dict(er, weights="q4g32", group_size=64)))
    put(t, "bad-weights", js(dict(er, weights="q3")))
    put(t, "bad-sparse", js(dict(er, weights="q4", sparse_per_row=2)))
    put(t, "bad-embeddings", js(dict(er, weights="q8", embeddings="int4")))
    put(t, "bad-lmhead-group", js(dict(er, weights="q4g32", lm_head="q4g128")))
    put(t, "bad-quant-method", js({"quant_method": "gptq", "bits": 4, "group_size": 128}))
    put(t, "bad-no-quant-method", js({"weights": "q4"}))
    put(t, "bad-not-object", b'"q4"')


# ---- tokenizer.json ----

def tokenizer(n_merges=40, merges_as_strings=False, byte_level_regex=False, normalizer=None, extra_added=()):
    """A small byte-level BPE from tiny-base: its 256 byte tokens, its first merges, its added tokens."""
    with open(os.path.join(TINY, "tokenizer.json"), encoding="utf-8") as f:
        full = json.load(f)
    vocab_full = full["model"]["vocab"]
    merges = full["model"]["merges"][:n_merges]
    keep = {s: i for s, i in vocab_full.items() if i < 256}
    nid = 256
    for a, b in merges:
        keep[a + b] = nid
        nid += 1
    for m in merges:
        for s in m:
            assert s in keep, s
    added = [dict(a, id=nid + k) for k, a in enumerate(full["added_tokens"])] + list(extra_added)
    pre = ({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
           if byte_level_regex else
           {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]})
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"} if normalizer is None else normalizer,
        "pre_tokenizer": pre,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": keep, "merges": [" ".join(m) for m in merges] if merges_as_strings else merges},
    }


def seeds_tokenizer_load():
    t = "fuzz_tokenizer_load"
    base = tokenizer()
    ids = {a["content"]: a["id"] for a in base["added_tokens"]}
    cfg = {"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}, "bos_token": None}
    gen = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"]}
    put(t, "tiny", js(base))
    put(t, "tiny-config", js(base) + SEP + js(cfg))
    put(t, "tiny-config-gen", js(base) + SEP + js(cfg) + SEP + js(gen))
    put(t, "merge-strings-gpt2-regex", js(tokenizer(n_merges=20, merges_as_strings=True, byte_level_regex=True)))
    put(t, "norm-sequence", js(tokenizer(n_merges=10, normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "NFD"}]})))
    # Added tokens with the flags the matcher handles (normalized: false; lstrip / rstrip / single_word).
    flags = [{"id": 300, "content": "<tool>", "single_word": True, "lstrip": True, "rstrip": True,
              "normalized": False, "special": True},
             {"id": 301, "content": " ##", "single_word": False, "lstrip": False, "rstrip": True,
              "normalized": False, "special": False}]
    put(t, "added-flags", js(tokenizer(n_merges=5, extra_added=flags)))
    # Normalized added tokens (explicitly, and by default for a non-special one), one that NFC changes.
    norm = [{"id": 302, "content": "caf\u00e9", "normalized": True, "special": False},
            {"id": 303, "content": "e\u0301x", "special": False}]
    put(t, "added-normalized", js(tokenizer(n_merges=5, extra_added=norm)))
    bad = tokenizer(n_merges=3)
    bad["model"]["merges"].append(["zz", "q"])
    put(t, "bad-merge", js(bad))
    bad = tokenizer(n_merges=3)
    bad["normalizer"] = {"type": "Lowercase"}
    put(t, "bad-normalizer", js(bad))
    bad = tokenizer(n_merges=3)
    bad["pre_tokenizer"]["pretokenizers"].reverse()  # Split after ByteLevel
    put(t, "bad-split-after-bytelevel", js(bad))
    bad = tokenizer(n_merges=3)
    bad["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": "(unclosed"}
    put(t, "bad-regex", js(bad))
    put(t, "bad-no-model", js({"version": "1.0", "decoder": {"type": "ByteLevel"}}))
    put(t, "bad-config", js(base) + SEP + b'{"eos_token": "<|not-a-token|>"}')


def seeds_tokenize():
    t = "fuzz_tokenize"
    for name, text in [
        ("ascii", "Hello world! The answer is 42, isn't it? x = 3 + 4 * (5 - 1)."),
        ("chat", "<|im_start|>user\nWhat is 7*6?<|im_end|>\n<|im_start|>assistant\n<think>\n6*7 = 42\n</think>\n\n42"
                 "<|im_end|>\n<|endoftext|>"),
        ("whitespace", "  a\t\tb\n\n\n  c   \r\n d  "),
        ("unicode", "caf\u00e9 cafe\u0301 \u65e5\u672c\u8a9e \U0001F642 \ufb01 \u00bd \u0391\u03b2\u03b3"),
        ("digits", "1234567890 3.14159 -17 1e9 0x1F"),
    ]:
        put(t, name, text)
    put(t, "bad-utf8", b"ok \xff\xfe then \xc3( and \xe2\x82 end \xed\xa0\x80")
    put(t, "ids", struct.pack("<8H", 0, 1, 255, 256, 507, 508, 511, 600))


# ---- chat ----

def seeds_chat():
    t = "fuzz_chat"
    with open(os.path.join(TINY, "tokenizer_config.json"), "rb") as f:
        tiny_cfg = f.read()
    qwen25 = {"chat_template": "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{%- else %}"
                               "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.{%- endif %}"}
    qwen3 = {"chat_template": "{%- set content = message.content.split('</think>')[-1] %}<think>"}
    listed = {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "</think>"}]}

    def msgs(flags, items):
        return bytes([flags]) + b"\0".join(items)
    conv = msgs(1, [b"\x00You are terse.", b"\x01What is 2+2?", b"\x02<think>\nadd\n</think>\n\n4", b"\x01And 3+3?"])
    tools = msgs(3, [b"\x01Weather?", b"\x02calling", b"\x03{\"temp\": 20}", b"\x03{\"rain\": 0}", b"\x01thanks"])
    put(t, "tiny-chatml", tiny_cfg + SEP + conv)
    put(t, "qwen25", js(qwen25) + SEP + conv)
    put(t, "qwen3-tools", js(qwen3) + SEP + tools)
    put(t, "list-template", js(listed) + SEP + msgs(0, [b"\x01hi", b"\x02hello"]))
    put(t, "no-template", b"{}" + SEP + msgs(1, [b"\x01only user"]))
    put(t, "bad-role", js(qwen3) + SEP + msgs(1, [b"\x04narrator\nonce upon a time", b"\x01go on"]))
    put(t, "bad-template-type", b'{"chat_template": 7}' + SEP + msgs(1, [b"\x01x"]))


# ---- JSONL ----

def seeds_jsonl():
    t = "fuzz_jsonl"
    lines = {
        "messages": [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                                   {"role": "assistant", "content": "<think>add</think>\\boxed{4}"}],
                      "answer": 4, "budget": 100, "needs_reasoning": False}],
        "prompt": [{"prompt": "Say hi", "completion": "hi"}, {"prompt": "Eval only"}],
        "math": [{"problem": "Compute 1/2 + 1/4.", "solution": "We get $\\boxed{\\frac{3}{4}}$.",
                  "concise": "3/4"},
                 {"problem": "x?", "solution": "so x = 5. Final answer: 5", "answer": "5",
                  "concise": "x = 5", "verbose": "long"}],
        "gsm8k": [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
                  {"question": "Cost?", "answer": "It costs $1,000.50.\n####  1,000.50 "}],
        "text": [{"text": "Raw pretraining text.\nSecond line."}],
    }
    for name, recs in lines.items():
        put(t, name, b"\n".join(js(r) for r in recs) + b"\n")
    put(t, "mixed", b"\n".join(js(r[0]) for r in lines.values()) + b"\n\n   \n")
    put(t, "bad-json", b'{"prompt": "ok"}\n{"prompt": \n')
    put(t, "bad-role", js({"messages": [{"role": "narrator", "content": "x"}]}) + b"\n")
    put(t, "bad-gsm8k", js({"question": "q", "answer": "no final line"}) + b"\n")
    put(t, "bad-budget", js({"prompt": "p", "budget": 0}) + b"\n")
    put(t, "bad-nul", b'{"prompt": "a\0b"}\n')


# ---- PEFT adapter ----

TINY_SHAPE = {"q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64), "o_proj": (128, 128),
              "gate_proj": (128, 384), "up_proj": (128, 384), "down_proj": (384, 128)}  # (in, out)


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def adapter(targets, r, dtype="F32", layers=4, config=None, drop=None):
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.05,
           "target_modules": targets, "bias": "none", "use_rslora": False, "fan_in_fan_out": False,
           "use_dora": False, "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None,
           "init_lora_weights": True, "base_model_name_or_path": "tiny-base", "er_mask": "response",
           "er_reasoning_prefix": "<think>\n"}
    cfg.update(config or {})
    tensors = []
    names = list(TINY_SHAPE) if targets == "all-linear" else targets
    k = 0
    for l in range(layers):
        for tname in names:
            din, dout = TINY_SHAPE[tname]
            part = "self_attn" if tname in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            for ab, shape in (("A", [r, din]), ("B", [dout, r])):
                n = shape[0] * shape[1]
                vals = [((k * 7 + i * 3) % 17 - 8) / 64.0 for i in range(n)]
                k += 1
                name = "base_model.model.model.layers.%d.%s.%s.lora_%s.weight" % (l, part, tname, ab)
                if name == drop:
                    continue
                tensors.append((name, dtype, shape, f32(vals) if dtype == "F32" else bf16(vals)))
    return js(cfg) + SEP + safetensors(tensors, {"format": "pt"})


def seeds_adapter():
    t = "fuzz_adapter"
    put(t, "q-r1", adapter(["q_proj"], 1))
    put(t, "qv-r2-bf16", adapter(["q_proj", "v_proj"], 2, "BF16", config={"use_rslora": True, "er_mask": "all"}))
    put(t, "all-linear-r1-bf16", adapter("all-linear", 1, "BF16"))
    put(t, "bad-missing-tensor",
        adapter(["q_proj"], 1, drop="base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight"))
    put(t, "bad-rank-pattern", adapter(["q_proj"], 1, config={"rank_pattern": {"q_proj": 4}}))
    put(t, "bad-layer", adapter(["q_proj"], 1, layers=5))
    put(t, "bad-rank", adapter(["q_proj"], 1, config={"r": 2}))
    put(t, "bad-dora", adapter(["q_proj"], 1, config={"use_dora": True, "init_lora_weights": "pissa"}))
    put(t, "config-only", js({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))


# ---- trained heads ----

def fnv1a(h, data):
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def tiny_fingerprint():
    """model_fingerprint (model/head.c) of tiny-base: FNV-1a over the dims, then 16 embedding rows."""
    c = tiny_config()
    dims = [c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
            c["head_dim"], c["intermediate_size"], c["vocab_size"], 1 if c["tie_word_embeddings"] else 0]
    h = fnv1a(0xCBF29CE484222325, struct.pack("<8i", *dims))
    with open(os.path.join(TINY, "model.safetensors"), "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    e = json.loads(raw[8:8 + n])["model.embed_tokens.weight"]
    assert e["dtype"] == "F32"
    base = 8 + n + e["data_offsets"][0]
    V, C = e["shape"]
    for i in range(16):
        row = i * (V - 1) // 15
        h = fnv1a(h, raw[base + row * C * 4: base + (row + 1) * C * 4])
    return "%016x" % h


def head(role, kind, hidden, fp, extra=None, tensors=None, size_mod4=None):
    C = 128
    j = {"format": "er_head", "version": 1, "role": role, "kind": kind, "in": C,
         "hidden": hidden if kind == "mlp" else 0,
         "dropout": 0.1, "threshold": 0.5, "model_fingerprint": fp, "metrics": {"auc": 0.9}}
    j["features"] = ({"kind": "prompt_ema", "hidden_state": "final_norm_output", "chunk": 128, "alpha": 0.5}
                     if role == "switcher" else
                     {"kind": "verify_last", "hidden_state": "final_norm_output",
                      "prompt": "\nIs this solution correct?", "adapter_on": False})
    j.update(extra or {})
    H = hidden if kind == "mlp" else 1
    if tensors is None:
        tensors = [("w1", "F32", [H, C], f32([((i * 5) % 11 - 5) / 50.0 for i in range(H * C)])),
                   ("b1", "F32", [H], f32([0.01 * i for i in range(H)]))]
        if kind == "mlp":
            tensors += [("w2", "F32", [1, H], f32([0.5 - 0.25 * i for i in range(H)])), ("b2", "F32", [1], f32([0.1]))]
    text, st = js(j), safetensors(tensors, {"format": "er_head", "role": role})
    if size_mod4 is not None:  # the harness picks the model (size % 4 == 3: none) and path spelling by size
        text += b" " * ((size_mod4 - len(text) - len(SEP) - len(st)) % 4)
    return text + SEP + st


def seeds_head():
    t = "fuzz_head"
    fp = tiny_fingerprint()
    for k in range(4):
        put(t, "switcher-mlp-%d" % k, head("switcher", "mlp", 4, fp, size_mod4=k))
        put(t, "verifier-linear-%d" % k, head("verifier", "linear", 0, fp, size_mod4=k))
    put(t, "bad-fingerprint", head("switcher", "mlp", 2, "0123456789abcdef"))
    put(t, "bad-shape", head("verifier", "linear", 0, fp, tensors=[("w1", "F32", [1, 64], f32([0.0] * 64)),
                                                                  ("b1", "F32", [1], f32([0.0]))]))
    put(t, "bad-nonfinite", head("verifier", "linear", 0, fp, tensors=[
        ("w1", "F32", [1, 128], f32([float("inf")] + [0.0] * 127)), ("b1", "F32", [1], f32([0.0]))]))
    put(t, "bad-threshold", head("switcher", "mlp", 2, fp, extra={"threshold": 1.5}))
    put(t, "bad-format", head("switcher", "mlp", 2, fp, extra={"format": "other"}))


# ---- GGUF ----

GG_U32, GG_I32, GG_F32, GG_BOOL, GG_STR, GG_ARR = 4, 5, 6, 7, 8, 9


def gstr(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def gkv(key, vtype, value):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == GG_STR:
        return out + gstr(value)
    if vtype == GG_ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        return out + b"".join(gstr(v) if etype == GG_STR else struct.pack("<i", v) for v in items)
    return out + struct.pack({GG_U32: "<I", GG_I32: "<i", GG_F32: "<f", GG_BOOL: "<B"}[vtype], value)


def gguf(kvs, tensors, version=3, align=32):
    """tensors: (name, ggml type, ne list, data bytes); offsets laid out like the writer does."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    infos, data = b"", b""
    for name, typ, ne, blob in tensors:
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", typ, len(data))
        data += blob + b"\0" * (-len(blob) % align)
    out = head + infos
    return out + b"\0" * (-len(out) % align) + data


# ggml type -> (elements, bytes) per block, and the byte offsets of a block's fp16 scales (ggml's layouts,
# quant/blocks.h): q4_0 2, q4_1 3, q5_0 6, q5_1 7, q8_0 8, q4_K 12, q5_K 13, q6_K 14.
GG_BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 12: (256, 144),
            13: (256, 176), 14: (256, 210)}
GG_SCALES = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def random_blocks(typ, n_blocks, rng):
    """Random block bytes of a block type, every fp16 scale a finite value of +-0.001 .. 0.01."""
    size = GG_BLOCK[typ][1]
    out = bytearray(rng.getrandbits(8) for _ in range(n_blocks * size))
    for b in range(n_blocks):
        for at in GG_SCALES[typ]:
            out[b * size + at:b * size + at + 2] = struct.pack("<e", rng.choice((-1, 1)) * rng.uniform(0.001, 0.01))
    return bytes(out)


def gguf_micro_model(mat_type=1, mat_types=None, FF=64, seed=0, spoil=None):
    """A one-layer qwen2 model (C 32, V 512) with the tiny tokenizer's arrays; zero weights of mat_type, or with
    mat_types (tensor name -> ggml block type, mat_type for the others) random blocks, spoil (name, byte, fp16 bits) one
    scale replaced."""
    with open(os.path.join(TINY, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    V, C = 512, 32
    tokens, types = ["[PAD%d]" % i for i in range(V)], [5] * V
    for tok, i in tj["model"]["vocab"].items():
        tokens[i], types[i] = tok, 1
    for a in tj["added_tokens"]:
        tokens[a["id"]], types[a["id"]] = a["content"], 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    kvs = [gkv("general.architecture", GG_STR, "qwen2"), gkv("general.file_type", GG_U32, 1)]
    for k, v in (("context_length", 256), ("embedding_length", C), ("block_count", 1), ("feed_forward_length", FF),
                 ("attention.head_count", 2), ("attention.head_count_kv", 1), ("attention.key_length", 16)):
        kvs.append(gkv("qwen2." + k, GG_U32, v))
    kvs += [gkv("qwen2.rope.freq_base", GG_F32, 10000.0), gkv("qwen2.attention.layer_norm_rms_epsilon", GG_F32, 1e-6),
            gkv("tokenizer.ggml.model", GG_STR, "gpt2"), gkv("tokenizer.ggml.pre", GG_STR, "qwen2"),
            gkv("tokenizer.ggml.tokens", GG_ARR, (GG_STR, tokens)),
            gkv("tokenizer.ggml.token_type", GG_ARR, (GG_I32, types)),
            gkv("tokenizer.ggml.merges", GG_ARR, (GG_STR, merges)), gkv("tokenizer.ggml.eos_token_id", GG_U32, 509)]
    rng = random.Random(seed)

    def mat(name, rows, cols):
        typ = (mat_types or {}).get(name, mat_type)
        n = rows * cols // GG_BLOCK[typ][0]
        data = random_blocks(typ, n, rng) if mat_types and typ in GG_SCALES else b"\0" * (n * GG_BLOCK[typ][1])
        if spoil and spoil[0] == name:
            data = data[:spoil[1]] + struct.pack("<H", spoil[2]) + data[spoil[1] + 2:]
        return (name, typ, [cols, rows], data)

    def vec(name, n):
        return (name, 0, [n], f32([1.0] * n))
    ts = [mat("token_embd.weight", V, C), vec("blk.0.attn_norm.weight", C), mat("blk.0.attn_q.weight", 32, C),
          vec("blk.0.attn_q.bias", 32), mat("blk.0.attn_k.weight", 16, C), vec("blk.0.attn_k.bias", 16),
          mat("blk.0.attn_v.weight", 16, C), vec("blk.0.attn_v.bias", 16), mat("blk.0.attn_output.weight", C, 32),
          vec("blk.0.ffn_norm.weight", C), mat("blk.0.ffn_gate.weight", FF, C), mat("blk.0.ffn_up.weight", FF, C),
          mat("blk.0.ffn_down.weight", C, FF), vec("output_norm.weight", C)]
    return gguf(kvs, ts)


def seeds_gguf():
    t = "fuzz_gguf"
    one = [("t", 0, [32], f32([0.5] * 32))]
    put(t, "valid-small", gguf([gkv("general.architecture", GG_STR, "qwen2"), gkv("a.list", GG_ARR, (GG_I32, [7, 9])),
                                gkv("a.flag", GG_BOOL, 1), gkv("a.f", GG_F32, 0.5)], one))
    put(t, "valid-model-f16", gguf_micro_model(1))
    put(t, "valid-model-q4_0", gguf_micro_model(2))
    put(t, "valid-model-q8_0", gguf_micro_model(8))
    # The block types kept in their bytes: q8_0 embeddings, the 32-element types in attention and the MLP's gate and
    # up, a k-quant on ffn_down (its rows of FF = 256 are one super-block), random codes and finite scales.
    blocks = {"token_embd.weight": 8, "blk.0.attn_q.weight": 3, "blk.0.attn_k.weight": 6, "blk.0.attn_v.weight": 7,
              "blk.0.attn_output.weight": 8, "blk.0.ffn_gate.weight": 6, "blk.0.ffn_up.weight": 7}
    for i, k in enumerate((12, 13, 14)):
        put(t, "valid-model-%s" % {12: "q4_K", 13: "q5_K", 14: "q6_K"}[k],
            gguf_micro_model(1, dict(blocks, **{"blk.0.ffn_down.weight": k}), FF=256, seed=i + 1))
    put(t, "bad-block-nan", gguf_micro_model(1, dict(blocks, **{"blk.0.ffn_down.weight": 12}), FF=256, seed=1,
                                             spoil=("blk.0.ffn_down.weight", 144 * 5, 0x7e00)))
    # A Q4_0 file as llama.cpp writes one: the layer matrices q4_0, the embedding q8_0; and one q4_0 scale infinite.
    q4_0 = {"token_embd.weight": 8}
    put(t, "valid-model-q4_0-blocks", gguf_micro_model(2, q4_0, seed=4))
    put(t, "bad-block-inf-q4_0", gguf_micro_model(2, q4_0, seed=5, spoil=("blk.0.ffn_up.weight", 18 * 3, 0x7c00)))
    put(t, "bad-version", gguf([], one, version=2))
    put(t, "bad-truncated", gguf([gkv("k", GG_STR, "value")], one)[:40])
    put(t, "bad-hugestring", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 60) + b"k" * 16)
    put(t, "bad-hugearray", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("k") + struct.pack("<IIQ", GG_ARR, 0, 1 << 50))
    put(t, "bad-tensor-type", gguf([], [("t", 99, [32], b"\0" * 128)]))
    put(t, "bad-misaligned", gguf([], one)[:-128].replace(struct.pack("<IQ", 0, 0), struct.pack("<IQ", 0, 4), 1))


# ---- erinfer memory: --where filters FUZZ_SEP an import JSONL ----

def seeds_memory():
    t = "fuzz_memory"
    jl = b"\n".join(js(r) for r in [
        {"text": "meeting notes about the budget", "metadata": {"tag": "work", "n": 3}, "created": 1000},
        {"text": "grocery list: milk, eggs", "metadata": {"tag": "home", "ok": True, "none": None}},
        {"text": "untagged thought", "metadata": None},
    ]) + b"\n"
    put(t, "valid", b'tag="work"\nn=3\nok=true\nnone=null\nbudget\n' + SEP + jl)
    put(t, "valid-import-only", jl)
    put(t, "filters-hostile", b'tag=work\n=1\na"b=1\nx=[1]\nAND OR NOT "\napple* NEAR(a b) col:x ^y\n' + SEP + jl)
    put(t, "bad-line", jl + b'{"text": "x", "metadata": [1]}\n')
    put(t, "bad-field", js({"txt": "typo"}) + b"\n")
    put(t, "bad-created", js({"text": "t", "created": -1}) + b"\n")
    put(t, "bad-empty-text", js({"text": "  "}) + b"\n")


HAND_WRITTEN = {"fuzz_serve_request"}


def main():
    # Inputs that once crashed a target (regress-*, added with their fix) stay, and so do the targets whose
    # seeds are written by hand (HAND_WRITTEN); the generated seeds are redone.
    for d, _, files in os.walk(OUT):
        for f in files:
            if not f.startswith("regress-") and os.path.basename(d) not in HAND_WRITTEN:
                os.remove(os.path.join(d, f))
    for f in (seeds_safetensors, seeds_config, seeds_quant_config, seeds_tokenizer_load, seeds_tokenize, seeds_chat,
              seeds_jsonl, seeds_adapter, seeds_head, seeds_gguf, seeds_memory):
        f()
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print("wrote %s (%d bytes)" % (OUT, total), file=sys.stderr)


if __name__ == "__main__":
    main()
