// GGUF files checked in real llama.cpp (node-llama-cpp's prebuilt CPU binaries, scripts/llama_cpp.sh): on a
// random Qwen2.5-shaped and a Qwen3-shaped model over the real Qwen tokenizer and on the tiny base, exported f32 /
// f16 / q8_0 / q4_0, llama.cpp's greedy tokens and per-token probabilities against ours on the same GGUF and on our own
// dir; the same with a LoRA GGUF; the tokenization of a corpus. Skips loudly without node / npm.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "lora/peft.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "tests/common/gguf_helpers.h"
#include "train/gguf_export.h"

// Tolerances on probabilities, relative. f32: the 1e-3 (measured: 2.4e-5). f16: the weights are the
// same bits in both, but llama.cpp rounds the activations of every f16 product to f16 (ggml's f16 vec_dot
// type), we keep them fp32 (measured: up to 4e-3). q8_0 and q4_0: likewise llama.cpp rounds the activations
// of every product to q8_0 blocks (vec_dot_q8_0_q8_0 / q4_0_q8_0: 8 bits per element plus a scale per 32),
// which moves probabilities by up to 0.12 (measured) and lets greedy paths part, so there only the
// probabilities are checked, along our own greedy path.
typedef struct {
    const char *type;
    double tol;
    int greedy_equal; // llama.cpp's greedy tokens must equal ours on the same GGUF
} TypeCase;
static const TypeCase CASES[] = {{"f32", 1e-3, 1}, {"f16", 1e-2, 1}, {"q8_0", 0.2, 0}, {"q4_0", 0.2, 0}};

// One model dir: each GGUF type through llama.cpp and through us.
static void check_model(const char *dir, const char *tmp, const char *prompt_text) {
    int np, *prompt = gguf_encode(dir, prompt_text, &np);
    Model dm;
    cr_assert_eq(model_load(&dm, dir, 0), ER_OK, "%s", er_last_error());
    GgufResult own;
    gguf_greedy(&dm, NULL, prompt, np, GGUF_N_NEW, own.tokens, own.probs);
    int seq[GGUF_MAX_IDS], ns = np + GGUF_N_NEW; // the held-out sequence: the prompt and our dir's greedy tokens
    memcpy(seq, prompt, (size_t)np * sizeof(int));
    memcpy(seq + np, own.tokens, sizeof own.tokens);
    gguf_score(&dm, NULL, NULL, seq, ns, own.score);
    model_free(&dm);
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        char path[512];
        snprintf(path, sizeof path, "%s/model-%s.gguf", tmp, CASES[c].type);
        cr_assert_eq(gguf_export_model(dir, path, CASES[c].type, NULL), ER_OK, "%s", er_last_error());
        Model gm;
        GgufResult ours, ll;
        cr_assert_eq(model_load(&gm, path, 0), ER_OK, "%s", er_last_error());
        gguf_greedy(&gm, NULL, prompt, np, GGUF_N_NEW, ours.tokens, ours.probs);
        gguf_score(&gm, NULL, NULL, seq, ns, ours.score);
        model_free(&gm);
        cJSON *job = gguf_llama_job(path, NULL, prompt, np, seq, ns), *out = gguf_llama_run(tmp, job);
        gguf_llama_result(out, &ll, ns);
        int k = gguf_agree(ll.tokens, ours.tokens, GGUF_N_NEW);
        double rg = gguf_max_rel(ours.probs, ll.probs, k), rs = gguf_max_rel(ours.score, ll.score, ns - 1);
        fprintf(stderr, "gguf vs llama.cpp %s %s: greedy %d/%d equal, greedy probs max rel %.2e, scored max rel %.2e\n",
                dir, CASES[c].type, k, GGUF_N_NEW, rg, rs);
        if (CASES[c].greedy_equal)
            cr_expect_eq(k, GGUF_N_NEW, "%s %s: llama.cpp's greedy tokens part from ours at %d", dir, CASES[c].type, k);
        if (!strcmp(CASES[c].type, "f32"))
            cr_expect_eq(gguf_agree(ours.tokens, own.tokens, GGUF_N_NEW), GGUF_N_NEW,
                         "%s: the f32 GGUF decodes unlike the dir", dir);
        cr_expect_leq(rg, CASES[c].tol, "%s %s: greedy probabilities differ by %.2e", dir, CASES[c].type, rg);
        cr_expect_leq(rs, CASES[c].tol, "%s %s: scored probabilities differ by %.2e", dir, CASES[c].type, rs);
        cJSON_Delete(job);
        cJSON_Delete(out);
    }
    er_free(prompt);
}




TestSuite(gguf_llama, .timeout = 600);

// A random LoRA adapter (rank 4, every projection) as PEFT, exported as a llama.cpp LoRA GGUF and applied
// there over the f32 GGUF; ours applies it unmasked (llama.cpp has no mask). Then, on the same sequence,
// how far erinfer's masked semantics (adapter off on the prompt) are from llama.cpp's: the mean absolute
// log-probability difference over the response tokens.
static void check_lora(const char *dir, const char *tmp, const char *prompt_text, float perturb) {
    int np, *prompt = gguf_encode(dir, prompt_text, &np);
    Model m;
    LoraAdapter a, loaded;
    cr_assert_eq(model_load(&m, dir, 0), ER_OK, "%s", er_last_error());
    helper_random_adapter(&a, &m.cfg, perturb, 5);
    a.masked = 1;
    char *ad = path_join(tmp, "adapter"), base[512], lora[512];
    cr_assert_eq(peft_save(&a, ad), ER_OK, "%s", er_last_error());
    LoraShape shape = model_config_lora_shape(&m.cfg);
    cr_assert_eq(peft_load(&loaded, ad, &shape, 0), ER_OK, "%s", er_last_error());
    snprintf(base, sizeof base, "%s/base-f32.gguf", tmp);
    snprintf(lora, sizeof lora, "%s/lora.gguf", tmp);
    cr_assert_eq(gguf_export_model(dir, base, "f32", NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_export_lora(dir, ad, lora, NULL), ER_OK, "%s", er_last_error());
    GgufResult ours, ll;
    gguf_greedy(&m, &loaded, prompt, np, GGUF_N_NEW, ours.tokens, ours.probs);
    int seq[GGUF_MAX_IDS], ns = np + GGUF_N_NEW;
    memcpy(seq, prompt, (size_t)np * sizeof(int));
    memcpy(seq + np, ours.tokens, sizeof ours.tokens);
    gguf_score(&m, &loaded, NULL, seq, ns, ours.score);
    cJSON *job = gguf_llama_job(base, lora, prompt, np, seq, ns), *out = gguf_llama_run(tmp, job);
    gguf_llama_result(out, &ll, ns);
    int k = gguf_agree(ll.tokens, ours.tokens, GGUF_N_NEW);
    double rg = gguf_max_rel(ours.probs, ll.probs, k), rs = gguf_max_rel(ours.score, ll.score, ns - 1);
    // Masked: the adapter on at input positions >= np (the response), as erinfer and training run it.
    uint8_t mask[GGUF_MAX_IDS];
    double masked[GGUF_MAX_IDS], base_p[GGUF_MAX_IDS], dm = 0, db = 0;
    for (int i = 0; i < ns; i++)
        mask[i] = i >= np;
    gguf_score(&m, &loaded, mask, seq, ns, masked);
    gguf_score(&m, NULL, NULL, seq, ns, base_p);
    for (int i = np - 1; i < ns - 1; i++) { // predictions of the response tokens
        dm += fabs(log(masked[i]) - log(ll.score[i])) / GGUF_N_NEW;
        db += fabs(log(base_p[i]) - log(ll.score[i])) / GGUF_N_NEW;
    }
    fprintf(stderr,
            "gguf-lora vs llama.cpp %s: greedy %d/%d equal, greedy probs max rel %.2e, scored max rel %.2e; response "
            "mean |log p(masked, erinfer) - log p(unmasked, llama.cpp)| = %.4f (base without adapter: %.4f)\n",
            dir, k, GGUF_N_NEW, rg, rs, dm, db);
    cr_expect_eq(k, GGUF_N_NEW, "%s: llama.cpp's greedy tokens with the LoRA part from ours at %d", dir, k);
    cr_expect_leq(rg, 1e-3, "%s: greedy probabilities with the LoRA differ by %.2e", dir, rg);
    cr_expect_leq(rs, 1e-3, "%s: scored probabilities with the LoRA differ by %.2e", dir, rs);
    cr_expect_gt(db, 10 * rs, "%s: the adapter changes nothing measurable", dir);
    // llama.cpp's per-request scale (llama-server's "lora": [{"id", "scale"}]) multiplies alpha / r.
    cJSON_AddNumberToObject(job, "lora_scale", 0.5);
    cJSON_Delete(out);
    out = gguf_llama_run(tmp, job);
    gguf_llama_result(out, &ll, ns);
    loaded.scale *= 0.5f;
    gguf_score(&m, &loaded, NULL, seq, ns, ours.score);
    double rh = gguf_max_rel(ours.score, ll.score, ns - 1);
    cr_expect_leq(rh, 1e-3, "%s: with the LoRA at scale 0.5 the probabilities differ by %.2e", dir, rh);
    cJSON_Delete(job);
    cJSON_Delete(out);
    lora_free(&a);
    lora_free(&loaded);
    model_free(&m);
    er_free(ad);
    er_free(prompt);
}




// The cases: a random Qwen2.5-shaped model over the real Qwen tokenizer ("qwen"), the same Qwen3-shaped
// ("qwen3": q/k norms, llama.cpp's qwen3 architecture), a random llama model over
// the tiny tokenizer ("llama": q/k rows permuted into llama.cpp's RoPE order, and back) and the tiny base; each
// exported and compared as a base model, or with a random LoRA adapter (perturb > 0). The tiny base's prompt is a
// problem as raw text, which it continues with a long trace: in the chat format it answers in a few tokens and
// stops, and llama.cpp ends a continuation at the end-of-turn token.
#define QWEN_PROMPT "<|im_start|>user\nWhat is 17 + 25? Think step by step.<|im_end|>\n<|im_start|>assistant\n"
#define TINY_PROMPT "Start with 3. Add 4. Multiply by 2. Subtract 5. What is the result?\n"

static void run_case(const char *kind, float perturb) {
    char *tmp = helper_tmpdir("er_gguf_ll"), *dir;
    if (strcmp(kind, "tiny") == 0) {
        dir = er_strdup(GGUF_TINY_BASE);
    } else {
        dir = path_join(tmp, kind);
        if (strcmp(kind, "llama") == 0)
            gguf_make_arch_dir(dir, ARCH_LLAMA);
        else
            gguf_make_qwen_dir(dir, strcmp(kind, "qwen3") == 0 ? ARCH_QWEN3 : ARCH_QWEN2);
    }
    const char *prompt = strncmp(kind, "qwen", 4) == 0 ? QWEN_PROMPT : TINY_PROMPT;
    if (perturb > 0)
        check_lora(dir, tmp, prompt, perturb);
    else
        check_model(dir, tmp, prompt);
    helper_rmdir(tmp);
    er_free(dir);
    er_free(tmp);
}

Test(gguf_llama, qwen_shaped) { run_case("qwen", 0); }
Test(gguf_llama, qwen3_shaped) { run_case("qwen3", 0); }
Test(gguf_llama, tiny_base) { run_case("tiny", 0); }
Test(gguf_llama, llama_arch) { run_case("llama", 0); }
Test(gguf_llama, lora_qwen_shaped) { run_case("qwen", 0.05f); }
Test(gguf_llama, lora_qwen3_shaped) { run_case("qwen3", 0.05f); }
Test(gguf_llama, lora_llama_arch) { run_case("llama", 0.05f); }
Test(gguf_llama, lora_tiny_base) { run_case("tiny", 0.05f); }

// The Qwen tokenizer corpus of tests/data (texts with Hugging Face's ids) tokenized by llama.cpp through the
// GGUF's tokenizer.ggml.* arrays, against ours (tests/model/test_gguf.c checks that ours from the GGUF is
// ours from tokenizer.json on the same corpus). llama.cpp does
// not apply the NFC normalizer of tokenizer.json: texts that NFC changes are counted apart (there llama.cpp
// differs from Hugging Face, and we follow Hugging Face).
Test(gguf_llama, tokenize_corpus) {
    char *tmp = helper_tmpdir("er_gguf_ll");
    char *dir = path_join(tmp, "qwen"), gguf[512];
    gguf_make_qwen_dir(dir, ARCH_QWEN2);
    snprintf(gguf, sizeof gguf, "%s/model.gguf", tmp);
    cr_assert_eq(gguf_export_model(dir, gguf, "f16", NULL), ER_OK, "%s", er_last_error());
    Tokenizer *hf;
    cr_assert_eq(tok_load(&hf, dir), ER_OK, "%s", er_last_error());
    char *buf;
    size_t len;
    cr_assert_eq(file_read_all("tests/data/golden/qwen_tokenizer.jsonl", 16u << 20, &buf, &len), ER_OK, "%s",
                 er_last_error());
    cJSON *job = cJSON_CreateObject(), *texts = cJSON_AddArrayToObject(job, "tokenize");
    cJSON_AddStringToObject(job, "model", gguf);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *rec = cJSON_Parse(line);
        cr_assert(rec && cJSON_IsString(cJSON_GetObjectItem(rec, "text")));
        cJSON_AddItemToArray(texts, cJSON_CreateString(cJSON_GetObjectItem(rec, "text")->valuestring));
        cJSON_Delete(rec);
    }
    cJSON *out = gguf_llama_run(tmp, job), *ll = cJSON_GetObjectItem(out, "tokenize");
    int n = cJSON_GetArraySize(texts), same = 0, nfc_changed = 0, bad = 0;
    cr_assert_eq(cJSON_GetArraySize(ll), n);
    for (int i = 0; i < n; i++) {
        const char *t = cJSON_GetArrayItem(texts, i)->valuestring;
        int *a, na;
        cr_assert_eq(tok_encode(hf, t, strlen(t), &a, &na), ER_OK, "%s", er_last_error());
        const cJSON *ids = cJSON_GetArrayItem(ll, i);
        int eq = cJSON_GetArraySize(ids) == na;
        for (int k = 0; eq && k < na; k++)
            eq = cJSON_GetArrayItem(ids, k)->valueint == a[k];
        char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)t);
        cr_assert(nfc);
        int changed = strcmp(nfc, t) != 0;
        nfc_changed += changed;
        same += eq;
        if (!eq && !changed && bad++ < 5)
            fprintf(stderr, "llama.cpp tokenizes text %d differently: \"%.60s\"\n", i, t);
        er_free(a);
        free(nfc);
    }
    fprintf(stderr, "gguf tokenizer: llama.cpp equals ours on %d of %d texts; %d are not NFC (%d of them differ)\n",
            same, n, nfc_changed, n - same - bad);
    cr_expect_eq(bad, 0, "llama.cpp tokenizes %d NFC texts unlike us", bad);
    cJSON_Delete(job);
    cJSON_Delete(out);
    er_free(buf);
    tok_free(hf);
    helper_rmdir(tmp);
    er_free(dir);
    er_free(tmp);
}

// Random q4_K / q6_K super-blocks for the (rows, cols) matrix t of w (replacing its data): random codes and
// scales, super-block scales small enough for a sane model.
static void random_k_blocks(GgufWriteTensor *t, uint32_t type, ErRng *rng) {
    size_t bb = type == GGML_Q4_K ? 144 : 210, nb = (size_t)t->ne[0] * t->ne[1] / GGML_QK_K;
    uint8_t *b = er_alloc(nb * bb);
    cr_assert(b);
    for (size_t i = 0; i < nb * bb; i++)
        b[i] = (uint8_t)(rng_u64(rng) >> 56);
    for (size_t k = 0; k < nb; k++) {
        uint8_t *blk = b + k * bb;
        if (type == GGML_Q4_K) {
            uint16_t d[2] = {f32_to_f16(1.5e-4f), f32_to_f16(6e-4f)};
            memcpy(blk, d, 4);
        } else {
            uint16_t d = f32_to_f16(1e-4f);
            for (int j = 0; j < 16; j++)
                blk[192 + j] = (uint8_t)(int8_t)((int)(blk[192 + j] % 61) - 30);
            memcpy(blk + 208, &d, 2);
        }
    }
    er_free(t->owned);
    t->type = type;
    t->nbytes = nb * bb;
    t->data = t->owned = b;
}

// The k-quants llama.cpp's common files hold (Q4_K_M: q4_K with q6_K for some tensors): a random qwen2 model
// (C 256, the tiny tokenizer) whose layer 0 and embedding are q6_K and layer 1 q4_K, written here block by
// block, imported in their types and compared with llama.cpp, which rounds activations to q8_K
// blocks for these products (hence the q8_0 tolerance).
Test(gguf_llama, k_quants_import) {
    char *tmp = helper_tmpdir("er_gguf_ll"), path[512];
    ModelConfig c = helper_tiny_config(512, 256);
    c.C = 256, c.FF = 512, c.HS = 64;
    Model m;
    Tokenizer *tok;
    GgufWriter w = {0};
    ErRng rng;
    rng_seed(&rng, 9);
    cr_assert_eq(model_build_random(&m, &c, 0.05f, 6), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_gguf_put(&m, GGML_F32, &w, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_gguf_put(tok, c.V, &w), ER_OK, "%s", er_last_error());
    for (int i = 0; i < w.n_tensors; i++)
        if (w.tensors[i].ndim == 2 && w.tensors[i].ne[0] % GGML_QK_K == 0)
            random_k_blocks(&w.tensors[i], strncmp(w.tensors[i].name, "blk.1.", 6) == 0 ? GGML_Q4_K : GGML_Q6_K, &rng);
    snprintf(path, sizeof path, "%s/k.gguf", tmp);
    cr_assert_eq(gguf_write(&w, path), ER_OK, "%s", er_last_error());
    gguf_writer_free(&w);
    model_free(&m);
    int np, k, *prompt = gguf_encode("data/tiny_tokenizer", TINY_PROMPT, &np);
    Model g;
    cr_assert_eq(model_load(&g, path, 0), ER_OK, "%s", er_last_error());
    cr_expect_eq(g.layers[1].wup.fmt, WF_Q4_K);
    cr_expect_eq(g.layers[0].wup.fmt, WF_Q6_K);
    double rs = gguf_vs_llama(&g, path, tmp, prompt, np, &k);
    fprintf(stderr, "gguf q4_K/q6_K import vs llama.cpp: greedy %d/%d equal, scored max rel %.2e\n", k, GGUF_N_NEW, rs);
    cr_expect_leq(rs, 0.2, "q4_K / q6_K: scored probabilities differ by %.2e", rs);
    model_free(&g);
    tok_free(tok);
    er_free(prompt);
    helper_rmdir(tmp);
    er_free(tmp);
}
