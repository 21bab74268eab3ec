// The heads' features as the engine computes them, against direct computations over a full forward
// (ACTS_SCORE keeps the final-norm output at every position): the switcher's EMA over prompt chunks
// folded during the chunked prefill, and the verifier's hidden state after a verification prompt
// appended to a sample's KV cache (no re-prefill: the forward-position count says so).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "model/model.h"
#include "tests/common/heads_helpers.h"

static Model model;
static Tokenizer *tok;
static LoraAdapter ad;

static void setup(void) { helper_tiny_setup(&model, &tok, &ad); }
static void teardown(void) { helper_tiny_teardown(&model, tok, &ad); }
TestSuite(features, .init = setup, .fini = teardown);

static const char *PROMPT = "Start with 7. Add 5. Multiply by 3. Subtract 4. Divide by 2. Add 9. Multiply by 2. "
                            "Subtract 1. What is the result?";

static int prompt_ids(const char *text, int **ids) {
    int n;
    cr_assert_eq(tok_encode(tok, text, strlen(text), ids, &n), 0);
    return n;
}

// lnf (T, C) of a full forward over tokens with a per-position adapter mask (NULL = base model).
static float *full_lnf(const int *tokens, int T, const uint8_t *mask) {
    Activations a;
    cr_assert_eq(acts_alloc(&a, &model.cfg, 1, T, ACTS_SCORE, 0), 0);
    ModelInput in = {.B = 1, .T = T, .tokens = tokens, .adapter_mask = mask, .adapter = mask ? &ad : NULL};
    cr_assert_eq(model_forward(&model, &in, &a), 0, "%s", er_last_error());
    float *out = malloc(sizeof(float) * (size_t)T * model.cfg.C);
    memcpy(out, a.lnf, sizeof(float) * (size_t)T * model.cfg.C);
    acts_free(&a);
    return out;
}

static void assert_close(const float *a, const float *b, int n, double tol, const char *what) {
    for (int i = 0; i < n; i++)
        cr_assert(fabs(a[i] - b[i]) <= tol * (1 + fabs(b[i])), "%s [%d]: %.8g vs %.8g", what, i, a[i], b[i]);
}

static void check_ema(int engine_chunk, int feat_chunk, float alpha) {
    int *p, n = prompt_ids(PROMPT, &p), C = model.cfg.C;
    cr_assert_gt(n, 3 * feat_chunk, "the prompt must span several feature chunks (%d tokens)", n);
    float *lnf = full_lnf(p, n, NULL);
    double *ref = calloc((size_t)C, sizeof(double));
    int folds = 0;
    for (int s = 0; s < n; s += feat_chunk, folds++) {
        int len = n - s < feat_chunk ? n - s : feat_chunk;
        for (int c = 0; c < C; c++) {
            double m = 0;
            for (int t = s; t < s + len; t++)
                m += lnf[(size_t)t * C + c];
            m /= len;
            ref[c] = folds == 0 ? m : alpha * m + (1 - alpha) * ref[c];
        }
    }
    float *reff = malloc(sizeof(float) * C), *feat = malloc(sizeof(float) * C);
    for (int c = 0; c < C; c++)
        feat[c] = NAN; // whatever the buffer held must not leak into the features
    for (int c = 0; c < C; c++)
        reff[c] = (float)ref[c];
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 2, 256, engine_chunk, 0), 0);
    PromptFeatureSpec spec = {feat_chunk, alpha};
    GenStats st;
    cr_assert_eq(engine_prefill(&e, p, n, NULL, &spec, feat, &st), 0, "%s", er_last_error());
    assert_close(feat, reff, C, 1e-5, "EMA feature");
    cr_assert_eq(st.forward_positions, n);
    // Again with the prompt cached: features still see every position, and agree.
    float *again = malloc(sizeof(float) * C);
    for (int c = 0; c < C; c++)
        again[c] = INFINITY;
    cr_assert_eq(engine_prefill(&e, p, n, NULL, &spec, again, &st), 0);
    cr_assert_arr_eq(again, feat, sizeof(float) * C);
    // The prompt computed by engine_prefill is reused whole by the next generate.
    GenConfig g;
    gen_config_default(&g);
    g.max_new = 4;
    GenSample out[1];
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0);
    cr_assert_eq(st.prompt_reused, n);
    cr_assert_eq(st.forward_positions, out[0].n_tokens - 1, "no prompt position recomputed");
    gen_samples_free(out, 1);
    engine_free(&e);
    free(again);
    free(feat);
    free(reff);
    free(ref);
    free(lnf);
    free(p);
}

Test(features, prompt_ema_equals_direct_computation) { check_ema(16, 7, 0.5f); }
Test(features, prompt_ema_independent_of_forward_chunking) { check_ema(5, 7, 0.3f); }
Test(features, prompt_ema_alpha_one_keeps_the_last_chunk) { check_ema(64, 9, 1.0f); }

Test(features, verification_from_the_cache_equals_full_forward) {
    int *p, n = prompt_ids(PROMPT, &p), C = model.cfg.C;
    int *vq, nv = prompt_ids("\nIs this solution correct?", &vq);
    int *pre, npre = prompt_ids("<think>\n", &pre);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 3, 256, 16, 0), 0);
    GenConfig g = heads_sample_config(3, 12, 1.0f, 3, &ad);
    g.keep_kv = 1;
    GenSample out[3];
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0, "%s", er_last_error());
    for (int adapter_on = 0; adapter_on <= 1; adapter_on++)
        for (int i = 0; i < 3; i++) {
            float *feat = malloc(sizeof(float) * C);
            long fp0 = e.forward_positions;
            cr_assert_eq(engine_verify_features(&e, i, vq, nv, adapter_on, feat), 0, "%s", er_last_error());
            // The sample's response without a final EOS; a last token that is not EOS is not in the cache yet.
            int nr = out[i].n_tokens, eos = tok_is_eos(tok, out[i].tokens[nr - 1]);
            nr -= eos;
            int T = n + npre + nr + nv;
            long computed = e.forward_positions - fp0;
            cr_assert_eq(computed, nv + !eos, "only the verification tokens (and the sample's last token): %ld", computed);
            int *all = malloc(sizeof(int) * T);
            uint8_t *mask = malloc((size_t)T);
            memcpy(all, p, sizeof(int) * n);
            memcpy(all + n, pre, sizeof(int) * npre);
            memcpy(all + n + npre, out[i].tokens, sizeof(int) * nr);
            memcpy(all + n + npre + nr, vq, sizeof(int) * nv);
            for (int t = 0; t < T; t++)
                mask[t] = t < n ? 0 : t < n + npre + nr ? 1 : (uint8_t)adapter_on;
            float *lnf = full_lnf(all, T, mask);
            assert_close(feat, lnf + (size_t)(T - 1) * C, C, 1e-5, "verification feature");
            free(lnf);
            free(mask);
            free(all);
            free(feat);
        }
    // All samples in one batched pass: the same features, the same positions computed.
    float *all = malloc(sizeof(float) * 3 * C), *one = malloc(sizeof(float) * C);
    long fp0 = e.forward_positions, expect = 0;
    cr_assert_eq(engine_verify_features_all(&e, vq, nv, 1, all), 0, "%s", er_last_error());
    for (int i = 0; i < 3; i++)
        expect += nv + !tok_is_eos(tok, out[i].tokens[out[i].n_tokens - 1]);
    cr_assert_eq(e.forward_positions - fp0, expect);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(engine_verify_features(&e, i, vq, nv, 1, one), 0);
        assert_close(all + (size_t)i * C, one, C, 1e-5, "batched verification feature");
    }
    free(all);
    free(one);
    // The sequences were cut back: asking twice gives the same features.
    float *f1 = malloc(sizeof(float) * C), *f2 = malloc(sizeof(float) * C);
    cr_assert_eq(engine_verify_features(&e, 1, vq, nv, 0, f1), 0);
    cr_assert_eq(engine_verify_features(&e, 1, vq, nv, 0, f2), 0);
    cr_assert_arr_eq(f1, f2, sizeof(float) * C);
    cr_assert_lt(engine_verify_features(&e, 3, vq, nv, 0, f1), 0, "no such sample");
    engine_release_samples(&e);
    cr_assert_lt(engine_verify_features(&e, 0, vq, nv, 0, f1), 0, "released");
    cr_assert_eq(kv_cache_blocks_in_use(&e.kv), (n + npre + KV_BLOCK - 1) / KV_BLOCK, "only the prompt remains");
    free(f1);
    free(f2);
    gen_samples_free(out, 3);
    engine_free(&e);
    free(pre);
    free(vq);
    free(p);
}

// The claim in engine.h that erinfer eval relies on: the first N samples of an 8-sample call are an
// N-sample call's samples.
Test(features, first_samples_of_eight_equal_a_smaller_run) {
    int *p, n = prompt_ids(PROMPT, &p);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 8, 256, 16, 0), 0);
    GenConfig g;
    gen_config_default(&g);
    g.max_new = 16;
    g.sampler.temperature = 0.8f;
    g.seed = 21;
    g.adapter = &ad;
    GenSample eight[8], two[2];
    GenStats st;
    g.n_samples = 8;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, eight, &st), 0);
    g.n_samples = 2;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, two, &st), 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(two[i].n_tokens, eight[i].n_tokens);
        cr_assert_arr_eq(two[i].tokens, eight[i].tokens, sizeof(int) * two[i].n_tokens, "sample %d", i);
    }
    gen_samples_free(eight, 8);
    gen_samples_free(two, 2);
    engine_free(&e);
    free(p);
}
