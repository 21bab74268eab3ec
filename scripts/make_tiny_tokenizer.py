#!/usr/bin/env python3
"""Builds the tiny models' tokenizer: data/tiny_tokenizer/{tokenizer.json, tokenizer_config.json}.

Same Hugging Face tokenizer.json layout as Qwen's (byte-level BPE, the Qwen split regex, NFC, merges as
["a", "b"] pairs, ChatML added tokens), with a vocabulary of a few hundred tokens: the 256 byte tokens
(GPT-2 byte-to-unicode alphabet, in the same order as Qwen's first 256 ids) plus merges learned on the
synthetic "chains" corpus. The split regex isolates every digit (\\p{N} one at a time), so numbers
are tokenised digit by digit and no merge ever joins digits.

Deterministic: same corpus -> same files (ties between equally frequent pairs break on the pair's
strings). The committed files were made with

    build/ertrain synth chains --n 4000 --seed 1234 --out /tmp/tiny_corpus.jsonl
    python3 scripts/make_tiny_tokenizer.py --corpus /tmp/tiny_corpus.jsonl --out data/tiny_tokenizer

Only the standard library is used; \\p{L} / \\p{N} are approximated with Python's Unicode classes
(exact on ASCII text, which the corpus is; the script refuses non-ASCII corpora). It also prints
the mean token lengths of the corpus' completion styles.
"""
import argparse
import collections
import json
import os
import re
import sys

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
# The same pattern in Python's `re` syntax: \p{L} = [^\W\d_], \p{N} = \d, and "neither \r, \n, a letter
# nor a number" = (?:[^\r\n\w]|_).
PY_SPLIT = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*|"
                      r"\s*[\r\n]+|\s+(?!\S)|\s+")

ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
SPECIAL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}  # Qwen marks <think> / </think> non-special

# Bare ChatML, no default system message (data/chat.h: CHAT_CHATML).
CHAT_TEMPLATE = ("{%- for message in messages %}"
                 "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
                 "{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


BS, CS = bytes_to_unicode()
B2U = dict(zip(BS, CS))


def pretokens(text):
    for piece in PY_SPLIT.findall(text):
        yield "".join(B2U[b] for b in piece.encode("utf-8"))


def corpus_texts(path):
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            # What the model sees: the ChatML turns of a prompt and each completion style.
            yield "user\n" + r["problem"]
            for k in ("direct", "concise", "verbose"):
                yield "assistant\n" + r[k]
    yield "system\nYou are a helpful assistant."


def train(word_counts, n_merges):
    words = [(list(w), c) for w, c in sorted(word_counts.items())]
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for sym, c in words:
            for i in range(len(sym) - 1):
                pairs[(sym[i], sym[i + 1])] += c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        for sym, _ in words:
            i = 0
            while i < len(sym) - 1:
                if sym[i] == best[0] and sym[i + 1] == best[1]:
                    sym[i:i + 2] = [joined]
                i += 1
    return merges


def encode_word(w, ranks):
    sym = list(w)
    while len(sym) > 1:
        best, bi = None, -1
        for i in range(len(sym) - 1):
            r = ranks.get((sym[i], sym[i + 1]))
            if r is not None and (best is None or r < best):
                best, bi = r, i
        if best is None:
            break
        sym[bi:bi + 2] = [sym[bi] + sym[bi + 1]]
    return sym


def count_tokens(text, ranks):
    return sum(len(encode_word(w, ranks)) for w in pretokens(text))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="chains JSONL from `ertrain synth chains`")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--merges", type=int, default=251)  # 256 bytes + 251 merges + 5 added tokens = 512 ids
    args = ap.parse_args()

    counts = collections.Counter()
    for t in corpus_texts(args.corpus):
        if not t.isascii():
            sys.exit(f"{args.corpus}: non-ASCII text; the re-based split is only exact on ASCII")
        counts.update(pretokens(t))
    merges = train(counts, args.merges)

    vocab = {c: i for i, c in enumerate(CS)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab) + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t in SPECIAL} for i, t in enumerate(ADDED)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                   "single_word", "special")} for a in added},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")

    ranks = {m: i for i, m in enumerate(merges)}
    sums = collections.Counter()
    chars = collections.Counter()
    n = 0
    with open(args.corpus, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            n += 1
            for k in ("direct", "concise", "verbose"):
                sums[k] += count_tokens(r[k], ranks)
                chars[k] += len(r[k])
    print(f"vocab {len(vocab)} + {len(added)} added tokens, {len(merges)} merges")
    for k in ("direct", "concise", "verbose"):
        print(f"mean {k}: {chars[k] / n:.1f} chars, {sums[k] / n:.1f} tokens")
    print(f"verbose/concise: {chars['verbose'] / chars['concise']:.2f}x chars, "
          f"{sums['verbose'] / sums['concise']:.2f}x tokens")


if __name__ == "__main__":
    main()
