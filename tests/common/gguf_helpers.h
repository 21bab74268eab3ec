// Shared by the GGUF tests (tests/model/test_gguf*.c): model dirs to export (a random Qwen2.5-shaped model
// over the real Qwen tokenizer from the fixtures, the tiny base), our greedy decode and per-token
// probabilities through THE forward, and the same from llama.cpp (a job run by scripts/llama_cpp.sh), to
// compare across formats and with llama.cpp.
#ifndef TESTS_COMMON_GGUF_HELPERS_H
#define TESTS_COMMON_GGUF_HELPERS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "tests/common/helpers.h"

#define GGUF_TINY_BASE "models/tiny-base"

static inline char *gguf_fixture_dir(void) {
    const char *fx = getenv("ER_FIXTURES");
    char *dir = path_join(fx && *fx ? fx : "../shared/fixtures", "qwen-tokenizer");
    cr_assert(dir);
    return dir;
}

// A random Qwen-shaped model with the real Qwen tokenizer, saved fp32 into dir (init std 0.1: larger weights
// make peakier distributions but grow the activations, and with them every rounding difference between two
// implementations, in the same proportion as the margins between top tokens). ARCH_QWEN2: Qwen2.5's shape (two
// layers, C 64, GQA 4/2, untied, q/k/v biases, rope 1e6, the vocabulary padded to 151936); ARCH_QWEN3: Qwen3's
// (no biases, head_dim 32 apart from C / heads, tied as Qwen3-0.6B, q/k norms away from one so a misplaced
// norm shows). Skips loudly when the fixtures are missing.
static inline void gguf_make_qwen_dir(const char *dir, ModelArch arch) {
    char *fx = gguf_fixture_dir(), *tj = path_join(fx, "tokenizer.json"), *tc = path_join(fx, "tokenizer_config.json");
    if (!path_exists(tj))
        cr_skip_test("!!!!!! %s is MISSING (set ER_FIXTURES): the Qwen-shaped GGUF tests are SKIPPED !!!!!!", tj);
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 64, .FF = 128, .L = 2, .NH = 4, .NKV = 2, .HS = 16, .V = 151936,
                     .max_pos = 1024, .rope_theta = 1000000.0f, .eps = 1e-6f, .tied = 0, .qkv_bias = 1,
                     .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    if (arch == ARCH_QWEN3)
        c.arch = ARCH_QWEN3, c.HS = 32, c.tied = 1, c.qkv_bias = 0;
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.1f, 11), ER_OK, "%s", er_last_error());
    for (int l = 0; l < c.L && arch == ARCH_QWEN3; l++)
        for (int i = 0; i < c.HS; i++) {
            m.layers[l].q_norm[i] = 0.6f + 0.05f * (float)((i * 7 + l) % 17);
            m.layers[l].k_norm[i] = 1.4f - 0.04f * (float)((i * 5 + l) % 13);
        }
    cr_assert_eq(model_save(&m, dir, 0), ER_OK, "%s", er_last_error());
    model_free(&m);
    helper_copy_file(tj, dir, "tokenizer.json");
    helper_copy_file(tc, dir, "tokenizer_config.json");
    er_free(tj);
    er_free(tc);
    er_free(fx);
}

// A random llama-architecture dir over the tiny tokenizer (q/k rows are permuted in GGUF). C = 64 and init std
// 0.1, as the Qwen-shaped dir: with C = 32 (one 32-value block per q8_0 / q4_0 row) llama.cpp 3.22.1 on an AVX-512 CPU
// scored the quantized GGUFs up to 90x off the f32 dir (ours: q8_0 within 4% of it, q4_0 within 2x; measured);
// on AVX2 CPUs it agreed. Rows of one block do not occur in real models.
// ARCH_QWEN3 instead: the same shape with Qwen3's q/k norms and head_dim 32, without biases.
static inline void gguf_make_arch_dir(const char *dir, ModelArch arch) {
    ModelConfig c = helper_tiny_config(512, 256);
    c.C = 64, c.HS = 16, c.FF = 128;
    c.arch = arch;
    c.qkv_bias = arch == ARCH_LLAMA; // llama's attention_bias: the biases are permuted like the rows
    if (arch == ARCH_QWEN3)
        c.HS = 32;
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.1f, 4), ER_OK, "%s", er_last_error());
    for (int i = 0; i < m.n_params; i++) // nonzero biases and norms, so a wrong permutation shows
        if (m.params[i].ndim == 1)
            for (size_t k = 0; k < m.params[i].numel; k++)
                m.params[i].data[k] += 0.01f * (float)(k % 7);
    cr_assert_eq(model_save(&m, dir, 0), ER_OK, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", dir, "tokenizer.json");
    helper_copy_file("data/tiny_tokenizer/tokenizer_config.json", dir, "tokenizer_config.json");
}

// Our greedy continuation: n tokens after prompt (np), decoded with a KV cache as erinfer decodes, and
// each chosen token's probability. The adapter (NULL = base) applies at every position.
static inline void gguf_greedy(Model *m, const LoraAdapter *ad, const int *prompt, int np, int n, int *out,
                               double *probs) {
    const ModelConfig *c = &m->cfg;
    KVCache kv;
    Activations a;
    int slot;
    cr_assert_eq(kv_cache_alloc(&kv, c, KV_F32, 1, np + n, (size_t)(np + n), 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(kv_seq_open(&kv, &slot), ER_OK);
    cr_assert_eq(acts_alloc(&a, c, 1, np, ACTS_DECODE, 0), ER_OK, "%s", er_last_error());
    const int *toks = prompt;
    int T = np;
    for (int s = 0; s < n; s++) {
        ModelInput in = {.B = 1, .T = T, .tokens = toks, .adapter = ad, .kv = &kv, .kv_slots = &slot};
        cr_assert_eq(model_forward(m, &in, &a), ER_OK, "%s", er_last_error());
        int best = 0;
        for (int v = 1; v < c->V; v++)
            if (a.logits[v] > a.logits[best])
                best = v;
        double sum = 0;
        for (int v = 0; v < c->V; v++)
            sum += exp((double)a.logits[v] - a.logits[best]);
        out[s] = best;
        probs[s] = 1.0 / sum;
        toks = &out[s];
        T = 1;
    }
    acts_free(&a);
    kv_cache_free(&kv);
}

// p(ids[i+1] | ids[0..i]) for i < n - 1 into probs, teacher-forced in one pass; mask (n) as the forward's
// adapter mask (NULL = the adapter everywhere).
static inline void gguf_score(Model *m, const LoraAdapter *ad, const uint8_t *mask, const int *ids, int n,
                              double *probs) {
    const int V = m->cfg.V;
    Activations a;
    cr_assert_eq(acts_alloc(&a, &m->cfg, 1, n, ACTS_SCORE, 0), ER_OK, "%s", er_last_error());
    ModelInput in = {.B = 1, .T = n, .tokens = ids, .adapter = ad, .adapter_mask = mask};
    cr_assert_eq(model_forward(m, &in, &a), ER_OK, "%s", er_last_error());
    for (int i = 0; i + 1 < n; i++) {
        const float *l = a.logits + (size_t)i * V;
        float mx = l[0];
        for (int v = 1; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += exp((double)l[v] - mx);
        probs[i] = exp((double)l[ids[i + 1]] - mx) / sum;
    }
    acts_free(&a);
}

// max |a - b| / |b| over n values.
static inline double gguf_max_rel(const double *a, const double *b, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]) / fabs(b[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

// ---- llama.cpp on the same files (node-llama-cpp's prebuilt CPU binaries, scripts/llama_cpp.sh) ----

#define GGUF_N_NEW 32    // greedy tokens of a comparison
#define GGUF_MAX_IDS 256 // tokens of a scored sequence

// llama.cpp on a job (scripts/llama_cpp.mjs): the parsed output, or a loud skip when node / npm are missing.
static inline cJSON *gguf_llama_run(const char *dir, cJSON *job) {
    char *jp = path_join(dir, "job.json"), *op = path_join(dir, "out.json"), cmd[1024];
    cr_assert_eq(json_write_file(jp, job), ER_OK, "%s", er_last_error());
    snprintf(cmd, sizeof cmd, "bash scripts/llama_cpp.sh '%s' '%s' 2>&1", jp, op);
    int st = system(cmd);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        cr_skip_test("!!!!!! node / npm or node-llama-cpp unavailable: the llama.cpp comparison is SKIPPED !!!!!!");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "llama.cpp run failed (status %d)", st);
    cJSON *out;
    cr_assert_eq(json_parse_file(op, 256u << 20, &out), ER_OK, "%s", er_last_error());
    er_free(jp);
    er_free(op);
    return out;
}

static inline cJSON *gguf_int_array(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static inline int gguf_read_numbers(const cJSON *a, double *out, int cap) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        cr_assert(n < cap && cJSON_IsNumber(e));
        out[n++] = e->valuedouble;
    }
    return n;
}

// A job: greedy GGUF_N_NEW tokens after prompt, and the teacher-forced probabilities of seq.
static inline cJSON *gguf_llama_job(const char *model, const char *lora, const int *prompt, int np, const int *seq,
                                    int ns) {
    cJSON *job = cJSON_CreateObject(), *gen = cJSON_AddArrayToObject(job, "generate"), *g = cJSON_CreateObject();
    cJSON_AddStringToObject(job, "model", model);
    if (lora)
        cJSON_AddStringToObject(job, "lora", lora);
    cJSON_AddItemToObject(g, "prompt", gguf_int_array(prompt, np));
    cJSON_AddNumberToObject(g, "n", GGUF_N_NEW);
    cJSON_AddItemToArray(gen, g);
    cJSON *score = cJSON_AddArrayToObject(job, "score");
    cJSON_AddItemToArray(score, gguf_int_array(seq, ns));
    return job;
}

typedef struct {
    int tokens[GGUF_N_NEW];
    double probs[GGUF_N_NEW];
    double score[GGUF_MAX_IDS];
} GgufResult;

// A job's output (gguf_llama_run) into r; ns: the scored sequence's length.
static inline void gguf_llama_result(cJSON *out, GgufResult *r, int ns) {
    const cJSON *g = cJSON_GetArrayItem(cJSON_GetObjectItem(out, "generate"), 0);
    double t[GGUF_N_NEW];
    cr_assert_eq(gguf_read_numbers(cJSON_GetObjectItem(g, "tokens"), t, GGUF_N_NEW), GGUF_N_NEW);
    for (int i = 0; i < GGUF_N_NEW; i++)
        r->tokens[i] = (int)t[i];
    cr_assert_eq(gguf_read_numbers(cJSON_GetObjectItem(g, "probs"), r->probs, GGUF_N_NEW), GGUF_N_NEW);
    const cJSON *score = cJSON_GetArrayItem(cJSON_GetObjectItem(out, "score"), 0);
    cr_assert_eq(gguf_read_numbers(score, r->score, GGUF_MAX_IDS), ns - 1);
}

// The length of the common prefix of a and b (n each).
static inline int gguf_agree(const int *a, const int *b, int n) {
    int k = 0;
    while (k < n && a[k] == b[k])
        k++;
    return k;
}

// Our greedy tokens on g after prompt (np ids), then the prompt and those tokens scored by us and by llama.cpp on
// the GGUF file path (its job files in tmp): the count of llama.cpp's greedy tokens equal to ours (*agree) and the
// largest relative difference of the scored probabilities, returned.
static inline double gguf_vs_llama(Model *g, const char *path, const char *tmp, const int *prompt, int np, int *agree) {
    int seq[GGUF_MAX_IDS], ns = np + GGUF_N_NEW;
    GgufResult ours, ll;
    cr_assert_leq(ns, GGUF_MAX_IDS);
    gguf_greedy(g, NULL, prompt, np, GGUF_N_NEW, ours.tokens, ours.probs);
    memcpy(seq, prompt, (size_t)np * sizeof(int));
    memcpy(seq + np, ours.tokens, sizeof ours.tokens);
    gguf_score(g, NULL, NULL, seq, ns, ours.score);
    cJSON *job = gguf_llama_job(path, NULL, prompt, np, seq, ns), *out = gguf_llama_run(tmp, job);
    gguf_llama_result(out, &ll, ns);
    *agree = gguf_agree(ll.tokens, ours.tokens, GGUF_N_NEW);
    cJSON_Delete(job);
    cJSON_Delete(out);
    return gguf_max_rel(ours.score, ll.score, ns - 1);
}

// Text tokenized by dir's tokenizer (free with er_free).
static inline int *gguf_encode(const char *dir, const char *text, int *n) {
    Tokenizer *tok;
    int *ids;
    cr_assert_eq(tok_load(&tok, dir), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_encode(tok, text, strlen(text), &ids, n), ER_OK, "%s", er_last_error());
    tok_free(tok);
    return ids;
}

#endif
