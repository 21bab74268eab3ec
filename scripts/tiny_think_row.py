#!/usr/bin/env python3
"""Gives a tiny base's "</think>" token an embedding row it can be taught to emit.

usage: scripts/tiny_think_row.py MODEL_DIR

The tiny bases (scripts/build_tiny_base.sh) are pretrained on thinking that never closes ("<think>\\n...\\nAnswer: 5"),
so the "</think>" row of their tied embedding is still its random initialisation, one of the ~100 rows of tokens
pretraining never used. A LoRA adapter that raises its logit raises theirs alike: sampled at temperature 0.8, an
SFT adapter trained to close its thinking emits one of them in 99% of its closes (greedy, the row wins narrowly).
This sets the row to the newline's row (where a closed thought goes on: "\\n</think>\\n\\nAnswer: 5" reads as a line
break before the answer) plus a seeded random offset of half its norm (so the two tokens' logits can part), as new
tokens are initialised from existing ones when a vocabulary grows. Rewrites MODEL_DIR/model.safetensors in place.
"""
import array
import json
import math
import os
import random
import struct
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2])
    d = sys.argv[1]
    tok = json.load(open(os.path.join(d, "tokenizer.json")))
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab = tok["model"]["vocab"]
    if "</think>" not in ids or "\u010a" not in vocab:
        sys.exit(f"tiny_think_row: {d}: the tokenizer has no \"</think>\" or newline token")
    close, newline = ids["</think>"], vocab["\u010a"]
    path = os.path.join(d, "model.safetensors")
    b = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    t = head.get("model.embed_tokens.weight")
    if not t or t["dtype"] != "F32":
        sys.exit(f"tiny_think_row: {path}: no F32 model.embed_tokens.weight")
    V, C = t["shape"]
    s, e = t["data_offsets"]
    w = array.array("f")
    w.frombytes(bytes(b[8 + n + s:8 + n + e]))
    nl = w[newline * C:(newline + 1) * C]
    rng = random.Random(511)
    off = [rng.gauss(0, 1) for _ in range(C)]
    k = 0.5 * math.sqrt(sum(x * x for x in nl)) / math.sqrt(sum(x * x for x in off))
    for j in range(C):
        w[close * C + j] = nl[j] + k * off[j]
    b[8 + n + s:8 + n + e] = w.tobytes()
    with open(path + ".tmp", "wb") as f:
        f.write(b)
    os.replace(path + ".tmp", path)
    print(f"tiny_think_row: {path}: row {close} (\"</think>\") = row {newline} (newline) + a half-norm offset")


if __name__ == "__main__":
    main()
