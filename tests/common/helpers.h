// Shared by the tests on a tiny random model: the model and a random adapter in memory, and,
// for the tests that run the built programs (erinfer, example) as a user would, a tiny random model
// dir in /tmp with the tiny tokenizer and a command runner that captures stdout, stderr and the exit
// status. The programs come from $ER_BUILD (default "build"), so `make SAN=1` tests run the
// sanitizer builds.
#ifndef TESTS_INFER_HELPERS_H
#define TESTS_INFER_HELPERS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "model/model.h"

static inline const char *helper_build_dir(void) {
    const char *b = getenv("ER_BUILD");
    return b && b[0] ? b : "build";
}

// Path of a built program, or NULL (with a loud skip message ready) when it is missing.
static inline char *helper_program(const char *name) {
    char *p = path_join(helper_build_dir(), name);
    cr_assert(p);
    if (access(p, X_OK) != 0) {
        er_free(p);
        return NULL;
    }
    return p;
}

// Skips the calling test, loudly, when the program was not built (prog is helper_program's NULL).
static inline void helper_need_program(const char *prog, const char *name, const char *tests) {
    if (!prog)
        cr_skip_test("!!!!!! %s/%s is MISSING: run `make` (or set ER_BUILD) - %s SKIPPED !!!!!!", helper_build_dir(),
                     name, tests);
}

// A fresh directory /tmp/<tag>XXXXXX (free with er_free after helper_rmdir).
static inline char *helper_tmpdir(const char *tag) {
    char tmpl[256];
    snprintf(tmpl, sizeof tmpl, "/tmp/%sXXXXXX", tag);
    cr_assert(mkdtemp(tmpl), "mkdtemp failed");
    return er_strdup(tmpl);
}

static inline void helper_rmdir(const char *dir) {
    if (!dir || strncmp(dir, "/tmp/", 5) != 0)
        return; // never anything outside /tmp
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0, "could not remove %s", dir);
}

// Writes text to path = /tmp/<stem>_<pid><ext> (the pid keeps parallel test processes apart); returns path.
static inline const char *helper_write_tmp(char *path, size_t cap, const char *stem, const char *ext,
                                           const char *text) {
    snprintf(path, cap, "/tmp/%s_%d%s", stem, (int)getpid(), ext);
    cr_assert_eq(file_write_atomic(path, text, strlen(text)), ER_OK, "%s", er_last_error());
    return path;
}

static inline void helper_copy_file(const char *src, const char *dir, const char *name) {
    char *data;
    size_t n;
    cr_assert_eq(file_read_all(src, 64u << 20, &data, &n), 0, "%s", er_last_error());
    char *dst = path_join(dir, name);
    cr_assert_eq(file_write_atomic(dst, data, n), 0, "%s", er_last_error());
    er_free(dst);
    er_free(data);
}

// How many distinct values x (n) holds, each written once into levels (cap of them at most): cap + 1 as
// soon as there are more, so a check "at most k levels" (k <= cap) fails.
static inline int helper_distinct(const float *x, int n, float *levels, int cap) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < m && levels[j] != x[i])
            j++;
        if (j == m) {
            if (m == cap)
                return cap + 1;
            levels[m++] = x[i];
        }
    }
    return m;
}

// The tiny model's shape over a vocabulary of V (the tiny tokenizer's): Qwen2, two layers, C = 32, GQA.
// DIR/NAME parsed as JSON (a run.json, an adapter or quantization config); the test fails if it is not.
static inline cJSON *helper_read_json(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    cJSON *j;
    cr_assert_eq(json_parse_file(p, 1 << 20, &j), 0, "%s", er_last_error());
    er_free(p);
    return j;
}

static inline ModelConfig helper_tiny_config(int V, int max_pos) {
    return (ModelConfig){.arch = ARCH_QWEN2, .C = 32, .FF = 64, .L = 2, .NH = 4, .NKV = 2, .HS = 8, .V = V,
                         .max_pos = max_pos, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1,
                         .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
}

// Adds scale * N(0, 1) to every parameter: B = 0 at init, so a fresh adapter would change nothing.
static inline void helper_perturb_adapter(LoraAdapter *a, float scale, uint64_t seed) {
    ErRng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < a->n_params; i++)
        a->params[i] += scale * rng_normal(&r);
}

// A random rank-4 adapter (alpha 8, every target, init seed 2) for a model of shape c, perturbed as above.
static inline void helper_random_adapter(LoraAdapter *a, const ModelConfig *c, float scale, uint64_t seed) {
    LoraShape s = model_config_lora_shape(c);
    cr_assert_eq(lora_init(a, &s, 4, 8.0f, 0, 0.0f, LORA_ALL_TARGETS, 0, 2), 0, "%s", er_last_error());
    helper_perturb_adapter(a, scale, seed);
}

// The in-memory fixture of the engine-level suites: 2 threads, the tiny tokenizer, a tiny random model
// over it (init scale 0.5, seed 7) and, when ad is not NULL, a random masked adapter (scale 0.1, seed 3).
static inline void helper_tiny_setup(Model *m, Tokenizer **tok, LoraAdapter *ad) {
    threads_set(2);
    cr_assert_eq(tok_load(tok, "data/tiny_tokenizer"), 0, "%s", er_last_error());
    ModelConfig c = helper_tiny_config(tok_vocab_size(*tok), 1024);
    cr_assert_eq(model_build_random(m, &c, 0.5f, 7), 0, "%s", er_last_error());
    if (ad) {
        helper_random_adapter(ad, &c, 0.1f, 3);
        ad->masked = 1;
    }
}

static inline void helper_tiny_teardown(Model *m, Tokenizer *tok, LoraAdapter *ad) {
    if (ad)
        lora_free(ad);
    model_free(m);
    tok_free(tok);
}

// The logits (B, T, V) of one scoring forward of m over tokens (B, T), the training-path attention with
// no cache, copied out (free with free).
static inline float *helper_forward_logits(Model *m, const int *tokens, int B, int T) {
    Activations a;
    cr_assert_eq(acts_alloc(&a, &m->cfg, B, T, ACTS_SCORE, 0), 0);
    ModelInput in = {.B = B, .T = T, .tokens = tokens};
    cr_assert_eq(model_forward(m, &in, &a), 0, "%s", er_last_error());
    size_t n = (size_t)B * T * m->cfg.V;
    float *out = malloc(sizeof(float) * n);
    memcpy(out, a.logits, sizeof(float) * n);
    acts_free(&a);
    return out;
}

// max |a - b| / max |b| over n values (b the reference)
static inline double helper_rel_err(const float *a, const float *b, size_t n) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)a[i] - b[i]));
        ref = fmax(ref, fabs((double)b[i]));
    }
    return err / ref;
}

// A tiny random Qwen2-shaped model saved as an HF dir, with the tiny tokenizer next to it.
static inline void helper_make_model(const char *dir) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), 0, "%s", er_last_error());
    ModelConfig c = helper_tiny_config(tok_vocab_size(tok), 4096);
    tok_free(tok);
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.5f, 3), 0, "%s", er_last_error());
    cr_assert_eq(model_save(&m, dir, 0), 0, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", dir, "tokenizer.json");
    helper_copy_file("data/tiny_tokenizer/tokenizer_config.json", dir, "tokenizer_config.json");
}

// A Qwen3-style chat template: its empty think block for enable_thinking=false is what chat_style_detect
// takes for CHAT_QWEN3 (a hybrid-thinking model); the real one is in the fixtures' qwen-tokenizer.
#define HELPER_QWEN3_TEMPLATE                                                                                      \
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}" \
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is "     \
    "defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"

// A tiny random hybrid-thinking model dir: Qwen3-shaped (q_norm / k_norm, no biases, head_dim 16 beside hidden 32 /
// 4 heads) over the tiny tokenizer, with a Qwen3-style chat template.
static inline void helper_make_hybrid_model(const char *dir) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), 0, "%s", er_last_error());
    ModelConfig c = helper_tiny_config(tok_vocab_size(tok), 4096);
    c.arch = ARCH_QWEN3, c.qkv_bias = 0, c.HS = 16;
    tok_free(tok);
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.5f, 3), 0, "%s", er_last_error());
    cr_assert_eq(model_save(&m, dir, 0), 0, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", dir, "tokenizer.json");
    char *text;
    size_t n;
    cr_assert_eq(file_read_all("data/tiny_tokenizer/tokenizer_config.json", 1 << 20, &text, &n), 0);
    cJSON *cfg = cJSON_Parse(text);
    er_free(text);
    cr_assert(cfg);
    cJSON_ReplaceItemInObject(cfg, "chat_template", cJSON_CreateString(HELPER_QWEN3_TEMPLATE));
    char *out = cJSON_Print(cfg), path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cr_assert_eq(file_write_atomic(path, out, strlen(out)), 0, "%s", er_last_error());
    cJSON_free(out);
    cJSON_Delete(cfg);
}

// The per-test fixture of the suites that run on a tiny model dir in /tmp: a fresh /tmp/<tag>XXXXXX, the
// tiny random model in tmp/model and, when prog is not NULL, that built program's path (NULL when it was
// not built: its tests call helper_need_program first).
typedef struct {
    char *tmp;    // the temp dir, removed by helper_fixture_close
    char *model;  // tmp/model
    char *prog;   // $ER_BUILD/<prog>, or NULL
} HelperFixture;

static inline void helper_fixture_open(HelperFixture *fx, const char *tag, const char *prog) {
    fx->prog = prog ? helper_program(prog) : NULL;
    fx->tmp = helper_tmpdir(tag);
    fx->model = path_join(fx->tmp, "model");
    cr_assert(fx->model);
    helper_make_model(fx->model);
}

static inline void helper_fixture_close(HelperFixture *fx) {
    helper_rmdir(fx->tmp);
    er_free(fx->model);
    er_free(fx->tmp);
    er_free(fx->prog);
    memset(fx, 0, sizeof *fx);
}

typedef struct {
    int status;  // exit status; 128 + signal when killed by one
    char *out;   // stdout (free with helper_result_free)
    char *err;   // stderr
} CmdResult;

static inline void helper_result_free(CmdResult *r) {
    er_free(r->out);
    er_free(r->err);
    memset(r, 0, sizeof *r);
}

// Runs `sh -c "<cmd> >tmp/stdout 2>tmp/stderr"` where cmd is printf-formatted.
static inline CmdResult helper_run(const char *tmp, const char *fmt, ...) {
    char cmd[4096], full[4600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "%s >'%s/stdout' 2>'%s/stderr' </dev/null", cmd, tmp, tmp);
    CmdResult r = {0};
    int st = system(full);
    cr_assert_neq(st, -1, "system() failed");
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    char path[600];
    size_t n;
    snprintf(path, sizeof path, "%s/stdout", tmp);
    cr_assert_eq(file_read_all(path, 64u << 20, &r.out, &n), 0, "%s", er_last_error());
    snprintf(path, sizeof path, "%s/stderr", tmp);
    cr_assert_eq(file_read_all(path, 64u << 20, &r.err, &n), 0, "%s", er_last_error());
    return r;
}

static inline int helper_count_lines(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

// A bad invocation: exit status 1 (not a crash) and exactly one line on stderr, mentioning needle.
// `what` names the invocation in failure messages. Frees r.
static inline void helper_expect_error(CmdResult *r, const char *what, const char *needle) {
    cr_assert_eq(r->status, 1, "%s: exited %d (expected 1); stderr:\n%s", what, r->status, r->err);
    cr_assert(strstr(r->err, needle), "%s: stderr \"%s\" does not mention \"%s\"", what, r->err, needle);
    cr_assert_eq(helper_count_lines(r->err), 1, "%s: expected one line on stderr, got:\n%s", what, r->err);
    helper_result_free(r);
}

#endif
