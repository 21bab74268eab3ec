// llama.cpp's own quantizer (llama_model_quantize, through bench/llama_quantize) on a GGUF file we write: a
// random qwen2 model over the tiny tokenizer, written F16, quantized by llama.cpp to Q8_0, Q4_0 and to the mixes
// common GGUF files hold, Q4_K_M and Q5_K_M. Its hidden size C = 384 is no multiple of the K-quants'
// 256-element super-block, so where a mix picks a K-quant for a matrix whose rows are C wide (all but
// ffn_down, whose rows are FF = 768 wide) llama.cpp falls back to a type of 32-element blocks (q4_K -> q5_0,
// q5_K -> q5_1, q6_K -> q8_0): each mix holds both kinds. Two layers are enough for Q4_K_M's q6_K ffn_down
// (llama.cpp's use_more_bits takes the last eighth of the layers: layer 1 of 2). Q4_0 gives every layer matrix q4_0
// and the token embedding (the model is tied: llama.cpp quantizes it as the output) the output's q6_K, which falls
// back to q8_0 the same way.
//   mix_*:    the tensor types of each file (printed) are what the mix should give;
//   import_*: our loader uses every layer matrix and the embedding as llama.cpp stored them (in place, no
//             fp32 copy), and our greedy tokens and probabilities on the file match llama.cpp's.
// Skips loudly without node / npm.
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gguf.h"
#include "data/tokenizer.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "quant/weight.h"
#include "tests/common/gguf_helpers.h"

#define QUANT_PROMPT "Start with 6. Add 9. Multiply by 3. Subtract 4. What is the result?\n"

typedef struct {
    const char *name; // of the file (NAME.gguf) and llama.cpp's file type (bench/llama_quantize's names)
} QuantCase;
static const QuantCase Q8_0 = {"q8_0"}, Q4_0 = {"q4_0"}, Q4_K_M = {"q4_k_m"}, Q5_K_M = {"q5_k_m"};

// llama.cpp quantizes in to out as type `name` (bench/llama_quantize, 2 threads, its log in out.log): the exit
// status. Installs node-llama-cpp first; skips the test loudly where that cannot be done.
static int llama_quantize_file(const char *in, const char *out, const char *name) {
    char *prog = helper_program("bench/llama_quantize"), cmd[2048];
    helper_need_program(prog, "bench/llama_quantize", "llama.cpp's quantizer test");
    int st = system("bash scripts/llama_cpp.sh --install 2>&1");
    if (WIFEXITED(st) && WEXITSTATUS(st) == 1)
        cr_skip_test("!!!!!! node / npm or node-llama-cpp unavailable: llama.cpp's quantizer test is SKIPPED !!!!!!");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripts/llama_cpp.sh --install failed (status %d)", st);
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' %s --threads 2 >'%s.log' 2>&1", prog, in, out, name, out);
    st = system(cmd);
    er_free(prog);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// A random qwen2 model (C 384, FF 768, 2 layers, GQA 6/2, HS 64, V 512, tied, q/k/v biases) over the tiny
// tokenizer, written F16 to tmp/in.gguf and quantized by llama.cpp to tmp/NAME.gguf, into path (512 bytes).
static void quantized_file(const char *tmp, const QuantCase *q, char *path) {
    char in[512];
    ModelConfig c = helper_tiny_config(512, 256);
    c.C = 384, c.FF = 768, c.NH = 6, c.NKV = 2, c.HS = 64;
    Model m;
    Tokenizer *tok;
    GgufWriter w = {0};
    cr_assert_eq(model_build_random(&m, &c, 0.05f, 6), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_gguf_put(&m, GGML_F16, &w, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_gguf_put(tok, c.V, &w), ER_OK, "%s", er_last_error());
    snprintf(in, sizeof in, "%s/in.gguf", tmp);
    cr_assert_eq(gguf_write(&w, in), ER_OK, "%s", er_last_error());
    gguf_writer_free(&w);
    tok_free(tok);
    model_free(&m);
    snprintf(path, 512, "%s/%s.gguf", tmp, q->name);
    int st = llama_quantize_file(in, path, q->name);
    cr_assert_eq(st, 0, "llama.cpp could not quantize %s to %s (status %d)", in, q->name, st);
}

// ---- the mixes ----

#define N_TYPES 64

// The count of f's tensors per ggml type, printed on one line.
static void count_types(const GgufFile *f, const char *name, int *n) {
    char line[512];
    int len = snprintf(line, sizeof line, "gguf_quantize %s, tensors per type:", name);
    memset(n, 0, N_TYPES * sizeof(int));
    for (int i = 0; i < f->n_tensors; i++) {
        cr_assert_lt(f->tensors[i].type, N_TYPES, "%s: tensor type %u", f->path, f->tensors[i].type);
        n[f->tensors[i].type]++;
    }
    for (uint32_t t = 0; t < N_TYPES; t++)
        if (n[t] && len < (int)sizeof line)
            len += snprintf(line + len, sizeof line - len, " %s %d", ggml_type_name(t), n[t]);
    fprintf(stderr, "%s\n", line);
}

// ggml type numbers (ggml.h's enum ggml_type) beside core/gguf.h's
enum { GGML_TYPE_Q4_1 = 3, GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q5_K = 13 };

static void check_mix(const QuantCase *q) {
    char *tmp = helper_tmpdir("er_gguf_q"), path[512];
    quantized_file(tmp, q, path);
    GgufFile f;
    int n[N_TYPES];
    cr_assert_eq(gguf_open(&f, path), ER_OK, "%s", er_last_error());
    count_types(&f, q->name, n);
    int n_2d = 0, blocks32 = n[GGML_TYPE_Q5_0] + n[GGML_TYPE_Q5_1] + n[GGML_TYPE_Q4_1] + n[GGML_Q8_0];
    for (int i = 0; i < f.n_tensors; i++)
        n_2d += f.tensors[i].ndim == 2;
    if (q == &Q8_0)
        cr_expect_eq(n[GGML_Q8_0], n_2d, "q8_0: %d of %d matrices are q8_0", n[GGML_Q8_0], n_2d);
    if (q == &Q4_0) {
        const GgufTensor *emb = gguf_find_tensor(&f, "token_embd.weight");
        cr_expect(emb && emb->type == GGML_Q8_0, "q4_0: token_embd is not q8_0");
        cr_expect_eq(n[GGML_Q4_0], n_2d - 1, "q4_0: %d of %d matrices are q4_0", n[GGML_Q4_0], n_2d);
    }
    if (q == &Q4_K_M) {
        cr_expect_gt(n[GGML_Q4_K], 0, "q4_k_m: no q4_K tensor");
        cr_expect_gt(n[GGML_Q6_K], 0, "q4_k_m: no q6_K tensor");
        cr_expect_gt(blocks32, 0, "q4_k_m: no q5_0, q5_1, q4_1 or q8_0 tensor");
    }
    if (q == &Q5_K_M)
        cr_expect_gt(n[GGML_TYPE_Q5_K], 0, "q5_k_m: no q5_K tensor");
    gguf_close(&f);
    helper_rmdir(tmp);
    er_free(tmp);
}

TestSuite(gguf_quantize, .timeout = 600);

Test(gguf_quantize, mix_q8_0) { check_mix(&Q8_0); }
Test(gguf_quantize, mix_q4_0) { check_mix(&Q4_0); }
Test(gguf_quantize, mix_q4_k_m) { check_mix(&Q4_K_M); }
Test(gguf_quantize, mix_q5_k_m) { check_mix(&Q5_K_M); }

// ---- our loader on them ----

// w, loaded from the tensor `name` of g's file: kept as stored (its format named as the ggml type, lowercased:
// "q4_K" -> "q4_k"), used in place (neither owned nor copied); its bytes and the tensor's added to *ours and
// *file.
static void check_in_place(const Model *g, const Weight *w, const char *name, size_t *ours, size_t *file) {
    const GgufTensor *t = gguf_find_tensor(g->gguf, name);
    cr_assert(t, "%s: no tensor %s", g->gguf->path, name);
    char want[32];
    const char *ty = ggml_type_name(t->type);
    size_t k = 0;
    for (; ty[k] && k + 1 < sizeof want; k++)
        want[k] = (char)tolower((unsigned char)ty[k]);
    want[k] = '\0';
    const char *got = weight_format_name(w->fmt);
    cr_expect(w->fmt != WF_F32 && strcmp(got, want) == 0 && w->owned == NULL && w->data == t->data,
              "%s: %s (%s in the file) loaded as %s, %s", g->gguf->path, name, ty, got,
              w->owned ? "owned (a copy)" : w->data != t->data ? "not in place" : "in place");
    *ours += weight_bytes(w);
    *file += t->nbytes;
}

static void check_import(const QuantCase *q) {
    char *tmp = helper_tmpdir("er_gguf_q"), path[512], name[96];
    quantized_file(tmp, q, path);
    Model g;
    cr_assert_eq(model_load(&g, path, 0), ER_OK, "%s", er_last_error());
    cr_assert(g.gguf, "%s: the model keeps no mapping of the file", path);
    size_t ours = 0, file = 0;
    check_in_place(&g, &g.embed, "token_embd.weight", &ours, &file);
    static const char *const proj[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < g.cfg.L; l++) {
        const LayerWeights *lw = &g.layers[l];
        const Weight *w[7] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->wgate, &lw->wup, &lw->wdown};
        for (int i = 0; i < 7; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, proj[i]);
            check_in_place(&g, w[i], name, &ours, &file);
        }
    }
    cr_expect_eq(ours, file, "%s: the embedding and layer matrices take %zu bytes loaded, %zu in the file", q->name,
                 ours, file);
    // The same file in llama.cpp: as k_quants_import in test_gguf_llama.c (llama.cpp rounds the activations
    // of these products to 8-bit blocks, hence only probabilities are held to a tolerance).
    int np, k, *prompt = gguf_encode("data/tiny_tokenizer", QUANT_PROMPT, &np);
    double rs = gguf_vs_llama(&g, path, tmp, prompt, np, &k);
    fprintf(stderr, "gguf_quantize %s vs llama.cpp: greedy %d/%d equal, scored max rel %.2e\n", q->name, k,
            GGUF_N_NEW, rs);
    cr_expect_leq(rs, 0.2, "%s: scored probabilities differ by %.2e", q->name, rs);
    // Tiled for decode as erinfer runs it (where this build has the tiled kernels): every matrix then in the
    // process's own memory (none left in the file's mapping), and the same comparison on the tiled products.
    size_t released;
    cr_assert_eq(model_tile_for_decode(&g, &released, NULL, NULL), ER_OK, "%s", er_last_error());
    int tiled = 0, mapped = 0;
    for (int i = 0; i < g.n_params; i++) {
        tiled += g.params[i].w && g.params[i].w->tiled;
        mapped += g.params[i].w && !g.params[i].w->owned;
    }
    cr_expect(!released || mapped == 0, "%s: %d matrices left in the file's mapping after tiling", q->name, mapped);
    rs = gguf_vs_llama(&g, path, tmp, prompt, np, &k);
    fprintf(stderr, "gguf_quantize %s tiled (%d matrices, %s) vs llama.cpp: greedy %d/%d equal, scored max rel %.2e\n",
            q->name, tiled, quant_simd_name(), k, GGUF_N_NEW, rs);
    cr_expect_leq(rs, 0.2, "%s tiled: scored probabilities differ by %.2e", q->name, rs);
    model_free(&g);
    er_free(prompt);
    helper_rmdir(tmp);
    er_free(tmp);
}

Test(gguf_quantize, import_q8_0) { check_import(&Q8_0); }
Test(gguf_quantize, import_q4_0) { check_import(&Q4_0); }
Test(gguf_quantize, import_q4_k_m) { check_import(&Q4_K_M); }
Test(gguf_quantize, import_q5_k_m) { check_import(&Q5_K_M); }
