// An application that links erinfer (the shipped liberinfer.a, or liberinfer.so) beside real llama.cpp (npm
// node-llama-cpp's libllama and libggml shared libraries), as an app that already ships llama.cpp would. One
// process: erinfer loads a model dir and llama.cpp the same model exported as GGUF, both stay loaded, and each
// decodes the same prompt greedily; the two continuations must be the same tokens.
//
//     beside_llama MODEL_DIR MODEL.gguf GGML_BACKEND_DIR
//
// What it guards: erinfer's internal functions share names with ggml's (gguf_find_tensor, ggml_type_name,
// gguf_add_tensor ...). Were any of them a global symbol of the archive, the linker would export it from this
// program and libllama's GGUF loader would call it instead of libggml-base's (ELF interposition), crashing on
// a struct it does not know. tests/link/beside_llama.sh builds and runs it in make test; llama.h is the pinned
// package's own (extracted from its llama.cpp source bundle). Prints one line per engine; exits 1 with one
// line on stderr when anything fails.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "erinfer.h"
#include "llama.h"

#define N_NEW 8
#define MAX_PROMPT 256
static const char PROMPT[] = "Start with 7. Add 5. Multiply by 3. What is the result?";

static int fail(const char *what, const char *why) {
    fprintf(stderr, "beside_llama: %s: %s\n", what, why);
    return 1;
}

// llama.cpp logs to stderr by default; only its errors matter here.
static void llama_quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

// erinfer's greedy continuation of PROMPT: N_NEW tokens (fewer at an EOS) into out, the prompt's length.
static int erinfer_greedy(ErModel *m, int *out, int *n_out, int *n_prompt) {
    ErSession *s = NULL;
    ErSessionParams sp;
    er_session_params_init(&sp);
    sp.max_tokens = MAX_PROMPT;
    if (er_session_open(&s, m, &sp) < 0)
        return fail("er_session_open", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = N_NEW;
    p.temperature = 0;
    if (er_generate_raw(s, PROMPT, &p, NULL, NULL) < 0) {
        int rc = fail("er_generate_raw", er_last_error());
        er_session_free(s);
        return rc;
    }
    const ErSample *x = er_result_sample(s, 0);
    *n_out = x->n_tokens;
    memcpy(out, x->tokens, (size_t)x->n_tokens * sizeof *out);
    *n_prompt = er_result_stats(s)->prompt_tokens;
    er_session_free(s);
    return 0;
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

// llama.cpp's greedy continuation of PROMPT (f32 KV cache, no flash attention: the model runs in f32 as in
// erinfer), stopping where erinfer stopped (n tokens).
static int llama_greedy(struct llama_model *model, int n, int *out, int *n_prompt) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = MAX_PROMPT, cp.n_batch = MAX_PROMPT, cp.n_ubatch = MAX_PROMPT, cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx)
        return fail("llama_init_from_model", "no context");
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int V = llama_vocab_n_tokens(vocab), rc = 0;
    llama_token tok[MAX_PROMPT];
    int np = llama_tokenize(vocab, PROMPT, (int)strlen(PROMPT), tok, MAX_PROMPT, true, true);
    *n_prompt = np;
    if (np <= 0)
        rc = fail("llama_tokenize", "no tokens");
    struct llama_batch b = llama_batch_get_one(tok, np);
    for (int i = 0; rc == 0 && i < n; i++) {
        if (llama_decode(ctx, b) != 0) {
            rc = fail("llama_decode", "failed");
            break;
        }
        const float *logits = llama_get_logits_ith(ctx, -1);
        if (!logits || !isfinite(logits[0])) {
            rc = fail("llama_get_logits_ith", "no finite logits");
            break;
        }
        out[i] = argmax(logits, V);
        tok[0] = out[i];
        b = llama_batch_get_one(tok, 1);
    }
    llama_free(ctx);
    return rc;
}

static void print_tokens(const char *who, const int *t, int n, int np) {
    printf("%-8s prompt %d tokens, greedy:", who, np);
    for (int i = 0; i < n; i++)
        printf(" %d", t[i]);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL_DIR MODEL.gguf GGML_BACKEND_DIR\n", argv[0]);
        return 1;
    }
    llama_log_set(llama_quiet, NULL);
    ggml_backend_load_all_from_path(argv[3]); // node-llama-cpp's CPU backends are loadable modules
    llama_backend_init();
    ErModel *m = NULL;
    if (er_model_load(&m, argv[1]) < 0)
        return fail(argv[1], er_last_error());
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *lm = llama_model_load_from_file(argv[2], mp); // both models loaded at once
    if (!lm) {
        er_model_free(m);
        return fail(argv[2], "llama.cpp could not load it");
    }
    int ours[N_NEW], theirs[N_NEW], n = 0, np_ours = 0, np_theirs = 0;
    int rc = erinfer_greedy(m, ours, &n, &np_ours);
    if (rc == 0)
        rc = llama_greedy(lm, n, theirs, &np_theirs);
    if (rc == 0) {
        print_tokens("erinfer", ours, n, np_ours);
        print_tokens("llama", theirs, n, np_theirs);
        if (n == 0 || np_ours != np_theirs || memcmp(ours, theirs, (size_t)n * sizeof *ours) != 0)
            rc = fail(argv[2], "llama.cpp's greedy tokens differ from erinfer's on the same model");
    }
    llama_model_free(lm);
    er_model_free(m);
    llama_backend_free();
    if (rc == 0)
        printf("ok: erinfer %s and llama.cpp in one process\n", er_version());
    return rc;
}
