// Masked LoRA through the whole model against the independent PyTorch reference
// (scripts/ref/make_lora_ref.py): a base model dir and a PEFT adapter written by the reference, loaded
// with model_load + peft_load; logits, loss, adapter gradients and the input gradient must match. Then
// the masked rule itself: with the mask off the adapter changes no bit, and the prompt's keys and values
// under a masked adapter are bit for bit a base prefill's (the KV-sharing rule), so decoding the response
// with the adapter on top of a base prefill gives the reference logits. `make test` generates the data
// into $ER_REF_DIR first; without torch these tests are skipped with a loud message.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "lora/peft.h"
#include "model/model.h"
#include "tests/common/ref.h"

static const char *const NAMES[LT_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// Everything a case holds, loaded.
typedef struct {
    char dir[1024];
    StFile ex;
    int B, T, V, C;
    const int *tokens, *lengths, *prompt_len, *targets;
    const uint8_t *amask;
    const float *loss_mask, *logits;
    double loss;
    Model m;
    LoraAdapter ad;
} Case;

static void case_open(Case *c, const char *name, int with_grads) {
    threads_set(2);
    ref_case_dir(c->dir, sizeof c->dir, name, "PyTorch LoRA reference data");
    char path[1100];
    snprintf(path, sizeof path, "%s/expected.safetensors", c->dir);
    cr_assert_eq(safetensors_open(&c->ex, path), 0, "%s", er_last_error());
    const StTensor *tt = ref_need_dtype(&c->ex, "tokens", DT_I32);
    c->B = (int)tt->shape[0];
    c->T = (int)tt->shape[1];
    c->tokens = tt->data;
    c->lengths = ref_need_dtype(&c->ex, "lengths", DT_I32)->data;
    c->prompt_len = ref_need_dtype(&c->ex, "prompt_len", DT_I32)->data;
    c->targets = ref_need_dtype(&c->ex, "targets", DT_I32)->data;
    c->amask = ref_need_dtype(&c->ex, "adapter_mask", DT_U8)->data;
    c->loss_mask = ref_need_dtype(&c->ex, "loss_mask", DT_F32)->data;
    c->logits = ref_need_dtype(&c->ex, "logits", DT_F32)->data;
    c->loss = *(const float *)ref_need_dtype(&c->ex, "loss", DT_F32)->data;

    snprintf(path, sizeof path, "%s/base", c->dir);
    cr_assert_eq(model_load(&c->m, path, 0), 0, "%s", er_last_error()); // a frozen base, as in SFT
    const ModelConfig *mc = &c->m.cfg;
    c->V = mc->V;
    c->C = mc->C;
    LoraShape s = model_config_lora_shape(mc);
    snprintf(path, sizeof path, "%s/adapter", c->dir);
    cr_assert_eq(peft_load(&c->ad, path, &s, with_grads), 0, "%s", er_last_error());
}

static void case_close(Case *c) {
    lora_free(&c->ad);
    model_free(&c->m);
    safetensors_close(&c->ex);
}

static void check_train(const char *name, int masked, unsigned targets) {
    Case c;
    case_open(&c, name, 1);
    cr_assert_eq(c.ad.masked, masked, "er_mask read from adapter_config.json");
    cr_assert_eq(c.ad.targets, targets, "target_modules read from adapter_config.json");
    Activations a;
    cr_assert_eq(acts_alloc(&a, &c.m.cfg, c.B, c.T, ACTS_TRAIN, 0), 0);
    ModelInput in = {.B = c.B, .T = c.T, .tokens = c.tokens, .adapter = &c.ad, .adapter_mask = c.amask};
    cr_assert_eq(model_forward(&c.m, &in, &a), 0, "%s", er_last_error());
    int B = c.B, T = c.T, V = c.V, C = c.C;
    for (int b = 0; b < B; b++) {
        char what[128];
        snprintf(what, sizeof what, "%s logits row %d", name, b);
        ref_assert_close(what, a.logits + (size_t)b * T * V, c.logits + (size_t)b * T * V, (size_t)c.lengths[b] * V,
                         1e-4);
    }
    double loss;
    lora_zero_grad(&c.ad);
    cr_assert_eq(model_loss(&a, c.targets, c.loss_mask, 1, &loss), 0, "%s", er_last_error());
    cr_assert(fabs(loss - c.loss) <= 1e-4 * fabs(c.loss), "%s loss %.8g vs reference %.8g", name, loss, c.loss);
    cr_assert_eq(model_backward(&c.m, &in, &a), 0, "%s", er_last_error());
    int n_checked = 0;
    for (int l = 0; l < c.m.cfg.L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            const LoraMat *mat = lora_mat(&c.ad, l, (LoraTarget)t);
            cr_assert_eq(mat != NULL, (targets >> t) & 1);
            if (!mat)
                continue;
            for (int ab = 0; ab < 2; ab++) {
                char key[160];
                snprintf(key, sizeof key, "grad.base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         t < 4 ? "self_attn" : "mlp", NAMES[t], ab ? 'B' : 'A');
                const StTensor *g = ref_need_dtype(&c.ex, key, DT_F32);
                size_t n = (size_t)c.ad.r * (ab ? mat->out : mat->in);
                cr_assert_eq((size_t)st_numel(g), n, "%s: shape", key);
                ref_assert_close(key, ab ? mat->gB : mat->gA, g->data, n, 1e-3);
                n_checked++;
            }
        }
    cr_assert_gt(n_checked, 0);
    const float *ref_dx = ref_need_dtype(&c.ex, "grad.inputs_embeds", DT_F32)->data;
    for (int b = 0; b < B; b++)
        ref_assert_close("grad.inputs_embeds", a.dres + (size_t)b * T * C, ref_dx + (size_t)b * T * C,
                     (size_t)c.lengths[b] * C, 1e-3);
    acts_free(&a);
    case_close(&c);
}

#define QV ((1u << LT_Q) | (1u << LT_V))
Test(lora_reference, masked_all_targets) { check_train("masked_all_targets", 1, LORA_ALL_TARGETS); }
Test(lora_reference, masked_qv_rslora) { check_train("masked_qv_rslora", 1, QV); }
Test(lora_reference, unmasked_all) { check_train("unmasked_all", 0, LORA_ALL_TARGETS); }
Test(lora_reference, qwen3_masked_all_targets) { check_train("qwen3_masked_all_targets", 1, LORA_ALL_TARGETS); }

// With the mask off everywhere the adapter changes no bit of the logits, in the training keeper and
// the scoring keeper.
static void check_mask_off(const char *name) {
    Case c;
    case_open(&c, name, 0);
    size_t BT = (size_t)c.B * c.T, n = BT * c.V;
    uint8_t *zeros = calloc(BT, 1);
    float *base = malloc(sizeof(float) * n);
    for (int mode = 0; mode < 2; mode++) {
        Activations a;
        cr_assert_eq(acts_alloc(&a, &c.m.cfg, c.B, c.T, mode ? ACTS_SCORE : ACTS_TRAIN, 0), 0);
        ModelInput in = {.B = c.B, .T = c.T, .tokens = c.tokens};
        cr_assert_eq(model_forward(&c.m, &in, &a), 0, "%s", er_last_error());
        memcpy(base, a.logits, sizeof(float) * n);
        in.adapter = &c.ad;
        in.adapter_mask = zeros;
        cr_assert_eq(model_forward(&c.m, &in, &a), 0, "%s", er_last_error());
        cr_assert_eq(memcmp(a.logits, base, sizeof(float) * n), 0, "%s: a zero mask changed the logits", name);
        // and the adapter is really there: with the reference mask the logits move
        in.adapter_mask = c.amask;
        cr_assert_eq(model_forward(&c.m, &in, &a), 0, "%s", er_last_error());
        cr_assert_neq(memcmp(a.logits, base, sizeof(float) * n), 0, "%s: the adapter changed nothing", name);
        acts_free(&a);
    }
    free(zeros);
    free(base);
    case_close(&c);
}

Test(lora_reference, mask_off_is_base_masked_all_targets) { check_mask_off("masked_all_targets"); }
Test(lora_reference, mask_off_is_base_qv_rslora) { check_mask_off("masked_qv_rslora"); }
Test(lora_reference, mask_off_is_base_unmasked_all) { check_mask_off("unmasked_all"); }
Test(lora_reference, mask_off_is_base_qwen3) { check_mask_off("qwen3_masked_all_targets"); }

// model.h: "adapter_mask ... NULL = everywhere": an adapter without a mask applies at every position.
Test(lora_reference, null_mask_means_everywhere) {
    Case c;
    case_open(&c, "unmasked_all", 0);
    size_t n = (size_t)c.B * c.T * c.V;
    Activations a;
    cr_assert_eq(acts_alloc(&a, &c.m.cfg, c.B, c.T, ACTS_SCORE, 0), 0);
    uint8_t *ones = malloc((size_t)c.B * c.T);
    memset(ones, 1, (size_t)c.B * c.T);
    ModelInput in = {.B = c.B, .T = c.T, .tokens = c.tokens, .adapter = &c.ad, .adapter_mask = ones};
    cr_assert_eq(model_forward(&c.m, &in, &a), 0, "%s", er_last_error());
    float *all = malloc(sizeof(float) * n);
    memcpy(all, a.logits, sizeof(float) * n);
    in.adapter_mask = NULL;
    cr_assert_eq(model_forward(&c.m, &in, &a), 0, "%s", er_last_error());
    cr_assert_eq(memcmp(a.logits, all, sizeof(float) * n), 0, "a NULL mask must equal a mask of ones");
    free(all);
    free(ones);
    acts_free(&a);
    case_close(&c);
}

// Position `pos` of sequence `slot` in layer l: its NKV*HS keys (or values). KVCache layout:
// (L, n_blocks, KV_BLOCK, NKV, HS), a sequence's positions in the blocks of its table.
static const float *kv_at(const KVCache *kv, int values, int l, int slot, int pos) {
    const KvSeq *s = &kv->seqs[slot];
    size_t p = ((size_t)l * kv->n_blocks + s->blocks[pos / KV_BLOCK]) * KV_BLOCK + pos % KV_BLOCK;
    return (const float *)(values ? kv->v : kv->k) + p * kv->NKV * kv->HS;
}

static void assert_kv_equal(const char *what, const KVCache *x, int sx, const KVCache *y, int sy, int L, int P,
                            int bitwise) {
    int row = x->NKV * x->HS;
    for (int l = 0; l < L; l++)
        for (int p = 0; p < P; p++)
            for (int v = 0; v < 2; v++) {
                const float *a = kv_at(x, v, l, sx, p), *b = kv_at(y, v, l, sy, p);
                if (bitwise)
                    cr_assert_eq(memcmp(a, b, sizeof(float) * row), 0, "%s: layer %d position %d %s differ", what, l, p,
                                 v ? "values" : "keys");
                else
                    ref_assert_close(what, a, b, row, 1e-5);
            }
}

// The KV-sharing rule, for every row of a masked case:
// (1) a masked-adapter pass over prompt + response leaves the prompt's keys and values bit for bit
//     those of a base pass over the same tokens;
// (2) and those of a base-only prefill of the prompt alone: bit for bit with the built-in GEMM, whose
//     rows do not depend on how many rows a call has; OpenBLAS's sgemm does depend on it (blocking
//     by row count), so there the base prefill differs from a longer base pass in the last bits
//     already, adapter or not, and the check is to 1e-5;
// (3) decoding the response with the adapter on, on top of that base prefill (what erinfer does),
//     gives the reference logits.
static void check_kv_sharing(const char *name) {
    Case c;
    case_open(&c, name, 0);
    const ModelConfig *mc = &c.m.cfg;
    int T = c.T, V = c.V;
    KVCache kv_ad, kv_full, kv_pre;
    cr_assert_eq(kv_cache_alloc(&kv_ad, mc, KV_F32, 1, T, T, 0), 0, "%s", er_last_error());
    cr_assert_eq(kv_cache_alloc(&kv_full, mc, KV_F32, 1, T, T, 0), 0, "%s", er_last_error());
    cr_assert_eq(kv_cache_alloc(&kv_pre, mc, KV_F32, 1, T, T, 0), 0, "%s", er_last_error());
    Activations a;
    cr_assert_eq(acts_alloc(&a, mc, 1, T, ACTS_SCORE, 0), 0);
#ifdef ER_BLAS
    int prefill_bitwise = 0;
#else
    int prefill_bitwise = 1;
#endif
    for (int b = 0; b < c.B; b++) {
        int n = c.lengths[b], P = c.prompt_len[b];
        const int *tok = c.tokens + (size_t)b * T;
        const uint8_t *am = c.amask + (size_t)b * T;
        for (int t = 0; t < n; t++)
            cr_assert_eq(am[t], t >= P, "%s row %d: the reference mask is not prompt-off/response-on", name, b);
        int s_ad, s_full, s_pre;
        cr_assert_eq(kv_seq_open(&kv_ad, &s_ad), 0);
        cr_assert_eq(kv_seq_open(&kv_full, &s_full), 0);
        cr_assert_eq(kv_seq_open(&kv_pre, &s_pre), 0);
        // the adapter pass over the whole row, through the cache
        ModelInput in = {.B = 1, .T = n, .tokens = tok, .adapter = &c.ad, .adapter_mask = am, .kv = &kv_ad,
                         .kv_slots = &s_ad};
        cr_assert_eq(model_forward(&c.m, &in, &a), 0, "%s", er_last_error());
        ref_assert_close("logits (adapter through the KV cache)", a.logits, c.logits + (size_t)b * T * V, (size_t)n * V,
                     1e-4);
        // (1) a base pass of the same shape
        ModelInput full = {.B = 1, .T = n, .tokens = tok, .kv = &kv_full, .kv_slots = &s_full};
        cr_assert_eq(model_forward(&c.m, &full, &a), 0, "%s", er_last_error());
        char what[160];
        snprintf(what, sizeof what, "%s row %d: prompt K/V under the masked adapter vs the base model", name, b);
        assert_kv_equal(what, &kv_ad, s_ad, &kv_full, s_full, mc->L, P, 1);
        // the adapter is on at the response: the first response position's values differ
        int row = mc->NKV * mc->HS;
        cr_assert_neq(memcmp(kv_at(&kv_ad, 1, 0, s_ad, P), kv_at(&kv_full, 1, 0, s_full, P), sizeof(float) * row), 0,
                      "%s row %d: the adapter did not change the response's values", name, b);
        // (2) the base prefill of the prompt alone
        ModelInput pre = {.B = 1, .T = P, .tokens = tok, .kv = &kv_pre, .kv_slots = &s_pre};
        cr_assert_eq(model_forward(&c.m, &pre, &a), 0, "%s", er_last_error());
        snprintf(what, sizeof what, "%s row %d: prompt K/V under the masked adapter vs a base prefill of the prompt",
                 name, b);
        assert_kv_equal(what, &kv_ad, s_ad, &kv_pre, s_pre, mc->L, P, prefill_bitwise);
        // (3) the response decoded with the adapter on, reusing the base prefill's keys and values
        int m = n - P;
        uint8_t ones[64];
        cr_assert_leq(m, 64);
        memset(ones, 1, sizeof ones);
        ModelInput dec = {.B = 1, .T = m, .tokens = tok + P, .adapter = &c.ad, .adapter_mask = ones, .kv = &kv_pre,
                          .kv_slots = &s_pre};
        cr_assert_eq(model_forward(&c.m, &dec, &a), 0, "%s", er_last_error());
        ref_assert_close("logits (response on top of a base prefill)", a.logits, c.logits + ((size_t)b * T + P) * V,
                     (size_t)m * V, 1e-4);
        kv_seq_close(&kv_ad, s_ad);
        kv_seq_close(&kv_full, s_full);
        kv_seq_close(&kv_pre, s_pre);
    }
    acts_free(&a);
    kv_cache_free(&kv_ad);
    kv_cache_free(&kv_full);
    kv_cache_free(&kv_pre);
    case_close(&c);
}

Test(lora_reference, kv_sharing_masked_all_targets) { check_kv_sharing("masked_all_targets"); }
Test(lora_reference, kv_sharing_masked_qv_rslora) { check_kv_sharing("masked_qv_rslora"); }
Test(lora_reference, kv_sharing_qwen3) { check_kv_sharing("qwen3_masked_all_targets"); }

// erinfer score --adapter on prompt/completion records: the adapter is on at completion positions
// only, and each completion token's log-prob matches the PyTorch reference's masked logits.
Test(lora_reference, erinfer_score_with_adapter, .timeout = 60) {
    Case c;
    case_open(&c, "masked_all_targets", 0);
    char in_path[] = "/tmp/er_lscore_in_XXXXXX", out_path[] = "/tmp/er_lscore_out_XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path);
    cr_assert(fi >= 0 && fo >= 0);
    FILE *f = fdopen(fi, "w");
    for (int b = 0; b < c.B; b++) {
        const int *tk = c.tokens + (size_t)b * c.T;
        fprintf(f, "{\"prompt_tokens\": [");
        for (int i = 0; i < c.prompt_len[b]; i++)
            fprintf(f, "%s%d", i ? ", " : "", tk[i]);
        fprintf(f, "], \"completion_tokens\": [");
        for (int i = c.prompt_len[b]; i < c.lengths[b]; i++)
            fprintf(f, "%s%d", i > c.prompt_len[b] ? ", " : "", tk[i]);
        fprintf(f, "]}\n");
    }
    fclose(f);
    close(fo);
    const char *build = getenv("ER_BUILD") ? getenv("ER_BUILD") : "build";
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/erinfer score --model %s/base --adapter %s/adapter --input %s --output %s --threads 1",
             build, c.dir, c.dir, in_path, out_path);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    JsonlReader r;
    cr_assert_eq(jsonl_open(&r, out_path), 0);
    cJSON *rec;
    int b = 0;
    while (jsonl_next(&r, &rec) == 1) {
        const int *tk = c.tokens + (size_t)b * c.T;
        int P = c.prompt_len[b], n = c.lengths[b] - P;
        cJSON *lp = cJSON_GetObjectItem(rec, "logprobs");
        cr_assert_eq(cJSON_GetArraySize(lp), n, "row %d: one log-prob per completion token", b);
        for (int j = 0; j < n; j++) {
            // log p(c[j] | prompt, c[<j]) from the reference logits at position P - 1 + j
            const float *row = c.logits + ((size_t)b * c.T + P - 1 + j) * c.V;
            double mx = -1e30, z = 0;
            for (int v = 0; v < c.V; v++)
                mx = fmax(mx, row[v]);
            for (int v = 0; v < c.V; v++)
                z += exp(row[v] - mx);
            double want = row[tk[P + j]] - mx - log(z), got = cJSON_GetArrayItem(lp, j)->valuedouble;
            cr_assert(fabs(got - want) <= 1e-4 * (1 + fabs(want)), "row %d token %d: %.7g vs reference %.7g", b, j, got,
                      want);
        }
        cJSON_Delete(rec);
        b++;
    }
    cr_assert_eq(b, c.B);
    jsonl_close(&r);
    unlink(in_path);
    unlink(out_path);
    case_close(&c);
}
