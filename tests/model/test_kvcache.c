// The KV cache as the forward's inference keeper: prefill + decode reproduce the training forward,
// forks share the prompt's blocks, int8 KV stays close to fp32, and misuse is refused.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "model/kv_kernel.h"
#include "model/model.h"
#include "tests/common/helpers.h"

static ModelConfig kv_config(void) {
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 32, .FF = 48, .L = 2, .NH = 4, .NKV = 2, .HS = 8, .V = 50,
                     .max_pos = 256, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 0, .qkv_bias = 1,
                     .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    return c;
}

static int tok_at(int seq, int i) { return (i * 7 + seq * 13 + 3) % 50; }

Test(kvcache, prefill_chunks_and_decode_match_full_forward) {
    threads_set(2);
    ModelConfig c = kv_config();
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 1), 0);
    int n = 45, prompt = 38, toks[45];
    for (int i = 0; i < n; i++)
        toks[i] = tok_at(0, i);
    float *ref = helper_forward_logits(&m, toks, 1, n);

    KVCache kv;
    cr_assert_eq(kv_cache_alloc(&kv, &c, KV_F32, 2, 64, 128, 0), 0);
    int slot;
    cr_assert_eq(kv_seq_open(&kv, &slot), 0);
    // Prefill in chunks of 16 (ACTS_SCORE keeps every position's logits to compare).
    Activations a, d;
    cr_assert_eq(acts_alloc(&a, &c, 1, 16, ACTS_SCORE, 0), 0);
    for (int p = 0; p < prompt; p += 16) {
        int len = prompt - p < 16 ? prompt - p : 16;
        ModelInput in = {.B = 1, .T = 16, .tokens = toks + p, .len = &len, .kv = &kv, .kv_slots = &slot};
        int padded[16];
        memcpy(padded, toks + p, sizeof(int) * len);
        for (int t = len; t < 16; t++)
            padded[t] = 0;
        in.tokens = padded;
        cr_assert_eq(model_forward(&m, &in, &a), 0, "%s", er_last_error());
        double e = helper_rel_err(a.logits, ref + (size_t)p * c.V, len * c.V);
        cr_assert(e <= 1e-5, "prefill chunk at %d: relative error %g", p, e);
    }
    cr_assert_eq(kv.seqs[slot].len, prompt);
    // Decode the rest one position at a time (ACTS_DECODE: last position's logits only).
    cr_assert_eq(acts_alloc(&d, &c, 1, 1, ACTS_DECODE, 0), 0);
    for (int p = prompt; p < n; p++) {
        ModelInput in = {.B = 1, .T = 1, .tokens = toks + p, .kv = &kv, .kv_slots = &slot};
        cr_assert_eq(model_forward(&m, &in, &d), 0, "%s", er_last_error());
        double e = helper_rel_err(d.logits, ref + (size_t)p * c.V, c.V);
        cr_assert(e <= 1e-5, "decode at %d: relative error %g", p, e);
    }
    acts_free(&a);
    acts_free(&d);
    kv_cache_free(&kv);
    free(ref);
    model_free(&m);
}

// N samples forked from one prompt: the prompt's blocks are stored once, each sample's tail is its
// own, batched decode of all N equals N separate full forwards.
Test(kvcache, forked_samples_share_the_prefix) {
    threads_set(2);
    ModelConfig c = kv_config();
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 2), 0);
    enum { P = 37, S = 4, STEPS = 6 }; // the prompt fills one block and part of a second
    int seqs[S][P + STEPS];
    for (int s = 0; s < S; s++)
        for (int i = 0; i < P + STEPS; i++)
            seqs[s][i] = i < P ? tok_at(0, i) : tok_at(s + 1, i);
    KVCache kv;
    cr_assert_eq(kv_cache_alloc(&kv, &c, KV_F32, S + 1, 64, P + S * STEPS, 0), 0);
    int root, slots[S];
    cr_assert_eq(kv_seq_open(&kv, &root), 0);
    Activations a, d;
    cr_assert_eq(acts_alloc(&a, &c, 1, P, ACTS_DECODE, 0), 0);
    ModelInput pre = {.B = 1, .T = P, .tokens = seqs[0], .kv = &kv, .kv_slots = &root};
    cr_assert_eq(model_forward(&m, &pre, &a), 0);
    int prompt_blocks = kv_cache_blocks_in_use(&kv);
    cr_assert_eq(prompt_blocks, 2);
    for (int s = 0; s < S; s++)
        cr_assert_eq(kv_seq_fork(&kv, root, &slots[s]), 0);
    cr_assert_eq(kv_cache_blocks_in_use(&kv), prompt_blocks, "forking must not allocate");

    cr_assert_eq(acts_alloc(&d, &c, S, 1, ACTS_DECODE, 0), 0);
    float *dec = malloc(sizeof(float) * S * STEPS * c.V);
    for (int t = 0; t < STEPS; t++) {
        int step_tok[S];
        for (int s = 0; s < S; s++)
            step_tok[s] = seqs[s][P + t];
        ModelInput in = {.B = S, .T = 1, .tokens = step_tok, .kv = &kv, .kv_slots = slots};
        cr_assert_eq(model_forward(&m, &in, &d), 0, "%s", er_last_error());
        for (int s = 0; s < S; s++)
            memcpy(dec + ((size_t)s * STEPS + t) * c.V, d.logits + (size_t)s * c.V, sizeof(float) * c.V);
    }
    // Memory: the full first block once, the prompt's partial block kept by the root, one own copy per sample.
    cr_assert_eq(kv.copied_blocks, S, "each sample copies only the shared partial block");
    cr_assert_eq(kv_cache_blocks_in_use(&kv), prompt_blocks + S);
    for (int s = 0; s < S; s++) {
        float *ref = helper_forward_logits(&m, seqs[s], 1, P + STEPS);
        for (int t = 0; t < STEPS; t++) {
            double e = helper_rel_err(dec + ((size_t)s * STEPS + t) * c.V, ref + (size_t)(P + t) * c.V, c.V);
            cr_assert(e <= 1e-5, "sample %d step %d: relative error %g", s, t, e);
        }
        free(ref);
    }
    // Closing everything returns every block.
    for (int s = 0; s < S; s++)
        kv_seq_close(&kv, slots[s]);
    kv_seq_close(&kv, root);
    cr_assert_eq(kv_cache_blocks_in_use(&kv), 0);
    free(dec);
    acts_free(&a);
    acts_free(&d);
    kv_cache_free(&kv);
    model_free(&m);
}

// KV8: one scale per position per KV head. Logits stay close to fp32 KV; the KL divergence is printed.
Test(kvcache, int8_close_to_fp32) {
    threads_set(2);
    ModelConfig c = kv_config();
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 3), 0);
    int n = 40, toks[40];
    for (int i = 0; i < n; i++)
        toks[i] = tok_at(2, i);
    double kl_sum = 0, max_err = 0;
    KVCache k32, k8;
    cr_assert_eq(kv_cache_alloc(&k32, &c, KV_F32, 1, 64, 64, 0), 0);
    cr_assert_eq(kv_cache_alloc(&k8, &c, KV_INT8, 1, 64, 64, 0), 0);
    // Per position and KV head: HS bytes + a 4-byte scale instead of 4 HS bytes.
    cr_assert_eq(k8.bytes * 4 * c.HS, k32.bytes * (c.HS + 4), "int8 KV memory");
    int s32, s8;
    kv_seq_open(&k32, &s32);
    kv_seq_open(&k8, &s8);
    Activations a;
    cr_assert_eq(acts_alloc(&a, &c, 1, 1, ACTS_DECODE, 0), 0);
    float *l32 = malloc(sizeof(float) * c.V);
    for (int p = 0; p < n; p++) {
        ModelInput in = {.B = 1, .T = 1, .tokens = toks + p, .kv = &k32, .kv_slots = &s32};
        cr_assert_eq(model_forward(&m, &in, &a), 0);
        memcpy(l32, a.logits, sizeof(float) * c.V);
        in.kv = &k8;
        in.kv_slots = &s8;
        cr_assert_eq(model_forward(&m, &in, &a), 0);
        double z32 = 0, z8 = 0, mx32 = -1e30, mx8 = -1e30;
        for (int v = 0; v < c.V; v++) {
            mx32 = fmax(mx32, l32[v]);
            mx8 = fmax(mx8, a.logits[v]);
            max_err = fmax(max_err, fabs(l32[v] - a.logits[v]));
        }
        for (int v = 0; v < c.V; v++) {
            z32 += exp(l32[v] - mx32);
            z8 += exp(a.logits[v] - mx8);
        }
        for (int v = 0; v < c.V; v++) {
            double p32 = exp(l32[v] - mx32) / z32, p8 = exp(a.logits[v] - mx8) / z8;
            kl_sum += p32 * log(p32 / p8);
        }
    }
    printf("int8 KV vs fp32 KV on the tiny model: mean KL %.3g nats/token, max logit error %.3g\n", kl_sum / n, max_err);
    cr_assert(kl_sum / n < 1e-3, "mean KL %g", kl_sum / n);
    cr_assert(max_err > 0, "int8 must actually quantise");
    free(l32);
    acts_free(&a);
    kv_cache_free(&k32);
    kv_cache_free(&k8);
    model_free(&m);
}

Test(kvcache, refuses_misuse) {
    ModelConfig c = kv_config();
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 4), 0);
    KVCache kv;
    cr_assert(kv_cache_alloc(&kv, &c, KV_F32, 2, 64, 1 << 20, 1 << 20) < 0, "too big for the limit");
    cr_assert(strstr(er_last_error(), "MiB"));
    // 3 sequences of up to 64 positions; room for 32 shared positions + one block each = 4 blocks.
    cr_assert_eq(kv_cache_alloc(&kv, &c, KV_F32, 3, 64, 32, 0), 0);
    cr_assert_eq(kv.n_blocks, 4);
    int s0, s1, s2;
    kv_seq_open(&kv, &s0);
    Activations a;
    cr_assert_eq(acts_alloc(&a, &c, 2, 40, ACTS_SCORE, 0), 0);
    int toks[80] = {0};
    int both[2] = {s0, s0};
    ModelInput in = {.B = 2, .T = 1, .tokens = toks, .kv = &kv, .kv_slots = both};
    cr_assert_eq(model_forward(&m, &in, &a), ER_EINVAL, "two rows into one sequence");
    int closed = 1;
    in = (ModelInput){.B = 1, .T = 1, .tokens = toks, .kv = &kv, .kv_slots = &closed};
    cr_assert_eq(model_forward(&m, &in, &a), ER_EINVAL, "sequence not open");
    // Over the per-sequence length: refused, and the sequence is left as it was.
    in = (ModelInput){.B = 1, .T = 30, .tokens = toks, .kv = &kv, .kv_slots = &s0};
    cr_assert_eq(model_forward(&m, &in, &a), 0);
    cr_assert_eq(model_forward(&m, &in, &a), 0);
    cr_assert(model_forward(&m, &in, &a) < 0, "90 positions > 64");
    cr_assert(strstr(er_last_error(), "per sequence"), "%s", er_last_error());
    cr_assert_eq(kv.seqs[s0].len, 60);
    // Out of blocks: s0 holds 2, s1 takes 2, s2 finds none.
    kv_seq_open(&kv, &s1);
    in.kv_slots = &s1;
    in.T = 40;
    cr_assert_eq(model_forward(&m, &in, &a), 0);
    kv_seq_open(&kv, &s2);
    in.kv_slots = &s2;
    in.T = 1;
    cr_assert(model_forward(&m, &in, &a) < 0);
    cr_assert(strstr(er_last_error(), "KV cache is full"), "%s", er_last_error());
    cr_assert_eq(kv.seqs[s2].len, 0);
    acts_free(&a);
    kv_cache_free(&kv);
    model_free(&m);
}

// Activations hold buffers per row (pos0, decode logits) and per position (attention scores): a pass
// with more rows or more positions than they were sized for is refused even when B x T would fit.
Test(kvcache, forward_refuses_a_shape_the_activations_do_not_hold) {
    ModelConfig c = helper_tiny_config(64, 64);
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.02f, 1), 0, "%s", er_last_error());
    Activations a;
    cr_assert_eq(acts_alloc(&a, &c, 4, 16, ACTS_SCORE, 0), 0, "%s", er_last_error());
    int tokens[64] = {0};
    ModelInput wide = {.B = 8, .T = 8, .tokens = tokens}, tall = {.B = 1, .T = 64, .tokens = tokens};
    cr_assert_lt(model_forward(&m, &wide, &a), 0, "8 rows into activations for 4");
    cr_assert(strstr(er_last_error(), "do not fit"), "%s", er_last_error());
    cr_assert_lt(model_forward(&m, &tall, &a), 0, "64 positions into activations for 16");
    ModelInput fits = {.B = 4, .T = 16, .tokens = tokens};
    cr_assert_eq(model_forward(&m, &fits, &a), 0, "%s", er_last_error());
    acts_free(&a);
    model_free(&m);
}

// out (B, T, NH, HS) of attention in double from the cache's entries as stored (an int8 entry times its
// scale), rows t < len[b] only: the check independent of every kernel.
static double kv_entry(const KVCache *kv, const void *base, const float *scales, size_t p, size_t at, int kh) {
    if (kv->type == KV_F32)
        return ((const float *)base)[at];
    return ((const int8_t *)base)[at] * (double)scales[p * kv->NKV + kh];
}

static void kv_attention_ref(double *out, const float *q, const KVCache *kv, int l, const int *slots,
                              const int *pos0, const int *len, int B, int T, int NH) {
    int NKV = kv->NKV, HS = kv->HS, G = NH / NKV;
    size_t row = (size_t)NKV * HS;
    double *sc = malloc(sizeof(double) * 4096);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < len[b]; t++)
            for (int h = 0; h < NH; h++) {
                const KvSeq *seq = &kv->seqs[slots[b]];
                const float *qv = q + (((size_t)b * T + t) * NH + h) * HS;
                int kh = h / G, last = pos0[b] + t;
                double mx = -1e300, sum = 0, *o = out + (((size_t)b * T + t) * NH + h) * HS;
                for (int s = 0; s <= last; s++) {
                    size_t p = ((size_t)l * kv->n_blocks + seq->blocks[s / KV_BLOCK]) * KV_BLOCK + s % KV_BLOCK;
                    double d = 0;
                    for (int i = 0; i < HS; i++)
                        d += (double)qv[i] * kv_entry(kv, kv->k, kv->ks, p, p * row + (size_t)kh * HS + i, kh);
                    sc[s] = d / sqrt((double)HS);
                    mx = fmax(mx, sc[s]);
                }
                for (int s = 0; s <= last; s++)
                    sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < HS; i++)
                    o[i] = 0;
                for (int s = 0; s <= last; s++) {
                    size_t p = ((size_t)l * kv->n_blocks + seq->blocks[s / KV_BLOCK]) * KV_BLOCK + s % KV_BLOCK;
                    for (int i = 0; i < HS; i++)
                        o[i] += sc[s] / sum * kv_entry(kv, kv->v, kv->vs, p, p * row + (size_t)kh * HS + i, kh);
                }
            }
    free(sc);
}

// The cached attention against double on random caches: odd head sizes (the kernels' 32-, 16- and 8-wide
// steps and scalar tails), GQA (NH query heads on 2 KV heads: 3 per group, or 9, more than the kernels take
// per pass), four sequences of 1 to 75 positions (a forked one with a copied block, partly filled last
// blocks, groups of four positions and remainders) and query rows of 1 to 3 positions; then the last
// sequence's one query alone (2 items on 2 threads: the groups split in parts). The int8 cache also runs the
// portable kernels, which the architecture's table (NEON on aarch64, AVX2 or AVX-512 on x86-64) must match, and
// with AVX-512 the AVX2 table, whose bits the AVX-512 one must give.
static int check_cached_attention(KvType type, int NH) {
    static const int head_sizes[] = {1, 7, 8, 17, 24, 40, 64, 65, 130};
    const KvI8Kernels *kk = kv_i8_kernels();
    enum { B = 4, T = 3, KEYS = 128 };
    int checked = 0;
    for (int hi = 0; hi < (int)(sizeof head_sizes / sizeof head_sizes[0]); hi++) {
        ModelConfig c = kv_config();
        c.HS = head_sizes[hi];
        c.NH = NH;
        KVCache kv;
        cr_assert_eq(kv_cache_alloc(&kv, &c, type, B, KEYS, 4 * KEYS, 0), 0);
        int slots[B], lens[B] = {70, 75, 33, 1}, pos0[B], len[B] = {3, 2, 3, 1};
        ErRng r;
        rng_seed(&r, 40 + hi);
        size_t row = (size_t)c.NKV * c.HS;
        float *kr = malloc(sizeof(float) * row), *vr = malloc(sizeof(float) * row);
        for (int b = 0; b < B; b++) {
            int from = 0;
            if (b == 1) { // a sample forked from sequence 0, its own positions from 70 on
                cr_assert_eq(kv_seq_fork(&kv, slots[0], &slots[1]), 0);
                from = lens[0];
            } else {
                cr_assert_eq(kv_seq_open(&kv, &slots[b]), 0);
            }
            cr_assert_eq(kv_seq_extend(&kv, slots[b], lens[b]), 0);
            for (int p = from; p < lens[b]; p++)
                for (int l = 0; l < c.L; l++) {
                    for (size_t i = 0; i < row; i++)
                        kr[i] = rng_normal(&r), vr[i] = rng_normal(&r) * (1 + (float)(i % 3));
                    kv_store_rows(&kv, l, kr, vr, &(int){kv_row(&kv, slots[b], p)}, 1);
                }
            pos0[b] = lens[b] - len[b];
        }
        cr_assert_eq(kv.copied_blocks, 1, "the fork copies the shared partial block");
        int mb = kv.max_blocks_per_seq, *blocks = malloc(sizeof(int) * B * mb);
        kv_block_table(&kv, slots, B, blocks);
        size_t n = (size_t)B * T * NH * c.HS;
        float *q = malloc(sizeof(float) * n), *o = calloc(n, sizeof(float)), *op = calloc(n, sizeof(float));
        float *scores = malloc(sizeof(float) * 2 * (NH / c.NKV) * KEYS), *batched = malloc(sizeof(float) * NH * c.HS);
        double *ref = calloc(n, sizeof(double));
        for (size_t i = 0; i < n; i++)
            q[i] = rng_normal(&r) * 2;
        for (int l = 0; l < c.L; l++) {
            cr_assert_eq(kv_attention_forward(o, q, &kv, l, blocks, pos0, len, B, T, NH, scores, 2, KEYS), 0);
            size_t last = (size_t)(B - 1) * T * NH * c.HS; // row B - 1 (one query) alone, written over NaN
            memcpy(batched, o + last, sizeof(float) * NH * c.HS);
            for (int i = 0; i < NH * c.HS; i++)
                o[last + i] = NAN;
            cr_assert_eq(kv_attention_forward(o + last, q + last, &kv, l, blocks + (B - 1) * mb, pos0 + B - 1, &(int){1}, 1, 1, NH,
                                              scores, 2, KEYS), 0);
            cr_assert(!memcmp(batched, o + last, sizeof(float) * NH * c.HS),
                      "%s HS=%d NH=%d layer %d: the query alone (its heads in parts) differs from it in the batch",
                      type == KV_F32 ? "fp32" : kk->name, c.HS, NH, l);
            if (type == KV_INT8)
                cr_assert_eq(kv_attention_forward_kernels(&kv_i8_portable, op, q, &kv, l, blocks, pos0, len, B, T, NH,
                                                          scores, 2, KEYS), 0);
#if KV_I8_AVX512
            if (type == KV_INT8) { // the 16-lane kernels: the 8-lane ones' arithmetic, byte for byte
                float *o8 = calloc(n, sizeof(float));
                cr_assert_eq(kv_attention_forward_kernels(&kv_i8_avx2, o8, q, &kv, l, blocks, pos0, len, B, T, NH,
                                                          scores, 2, KEYS), 0);
                for (int b = 0; b < B; b++) {
                    size_t at = (size_t)b * T * NH * c.HS;
                    cr_assert(!memcmp(o + at, o8 + at, sizeof(float) * len[b] * NH * c.HS),
                              "AVX-512 HS=%d NH=%d layer %d row %d: not the AVX2 kernels' bits", c.HS, NH, l, b);
                }
                free(o8);
            }
#endif
            kv_attention_ref(ref, q, &kv, l, slots, pos0, len, B, T, NH);
            for (int b = 0; b < B; b++)
                for (size_t i = 0; i < (size_t)len[b] * NH * c.HS; i++) {
                    size_t at = (size_t)b * T * NH * c.HS + i;
                    cr_assert(fabs(o[at] - ref[at]) <= 1e-4 * (1 + fabs(ref[at])),
                              "%s cache HS=%d layer %d row %d: out[%zu] = %.9g, double %.9g",
                              type == KV_F32 ? "fp32" : kk->name, c.HS, l, b, i, o[at], ref[at]);
                    if (type == KV_INT8) // one order of sums on every CPU (kv_kernel.h): the same bits
                        cr_assert(!memcmp(&o[at], &op[at], sizeof(float)),
                                  "%s HS=%d layer %d row %d: out[%zu] = %.9g, portable %.9g: not the same bits",
                                  kk->name, c.HS, l, b, i, o[at], op[at]);
                    checked++;
                }
        }
        free(kr);
        free(vr);
        free(q);
        free(o);
        free(op);
        free(scores);
        free(batched);
        free(ref);
        free(blocks);
        kv_cache_free(&kv);
    }
    return checked;
}

Test(kvcache, fp32_attention_matches_double) {
    printf("kvcache: fp32-cache attention matched double in %d outputs\n",
           check_cached_attention(KV_F32, 6) + check_cached_attention(KV_F32, 18));
}

Test(kvcache, int8_attention_kernels_match_portable) {
    const KvI8Kernels *kk = kv_i8_kernels();
#if defined(__aarch64__)
    cr_assert_neq(kk, &kv_i8_portable, "aarch64 builds must run the NEON kernels");
#elif KV_I8_AVX512
    cr_assert_eq(kk, &kv_i8_avx512, "AVX-512 builds must run the AVX-512 kernels");
#elif defined(__AVX2__) && defined(__FMA__)
    cr_assert_neq(kk, &kv_i8_portable, "AVX2 builds must run the AVX2 kernels");
#endif
    int checked = check_cached_attention(KV_INT8, 6) + check_cached_attention(KV_INT8, 18);
    printf("kvcache: int8 attention with the %s kernels: the portable ones' bits, and double's values, in %d "
           "outputs\n",
           kk->name, checked);
}
