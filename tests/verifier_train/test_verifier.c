// Verifier data collection on a tiny random model: the verifier's rows are the engine's verification
// features of the adapter's samples with graded labels; a missing gold answer is refused.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/grade.h"
#include "data/tokenizer.h"
#include "tests/common/heads_helpers.h"
#include "verifier_train/verifier.h"

static Model model;
static Tokenizer *tok;
static LoraAdapter ad;

static void setup(void) { helper_tiny_setup(&model, &tok, &ad); }
static void teardown(void) { helper_tiny_teardown(&model, tok, &ad); }
TestSuite(verifier_data, .init = setup, .fini = teardown);

static const char *PROMPT = "Start with 7. Add 5. What is the result?";

Test(verifier_data, rows_are_engine_features_with_graded_labels) {
    int *p, n, *vq, nv;
    cr_assert_eq(tok_encode(tok, PROMPT, strlen(PROMPT), &p, &n), 0);
    cr_assert_eq(tok_encode(tok, "\nCorrect?", 9, &vq, &nv), 0);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 4, 128, 16, 0), 0);
    GenConfig g = heads_sample_config(4, 10, 0.8f, 9, &ad);
    int C = model.cfg.C;
    float feats[4 * 32], labels[4];
    long tokens = 0;
    cr_assert_eq(verifier_collect(&e, p, n, &g, vq, nv, 0, "12", feats, labels, &tokens), 0, "%s", er_last_error());
    cr_assert_gt(tokens, 0);
    cr_assert_eq(e.n_kept, 0, "the samples' KV sequences are released");
    GenSample s[4];
    GenStats st;
    g.keep_kv = 1;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, s, &st), 0);
    for (int i = 0; i < 4; i++) {
        cr_assert(labels[i] == 0 || labels[i] == 1);
        int think_open = grade_think_opens(g.response_prefix);
        cr_assert_eq(labels[i], (float)grade_response(s[i].text, s[i].answer_at, think_open, "12", NULL));
        float f[32];
        cr_assert_eq(engine_verify_features(&e, i, vq, nv, 0, f), 0);
        for (int c = 0; c < C; c++) // the prompt's last position is recomputed here: equal up to rounding
            cr_assert(fabsf(f[c] - feats[i * C + c]) <= 1e-5f * (1 + fabsf(f[c])), "sample %d [%d]: %g vs %g", i, c,
                      f[c], feats[i * C + c]);
    }
    engine_release_samples(&e);
    gen_samples_free(s, 4);
    cr_assert_lt(verifier_collect(&e, p, n, &g, vq, nv, 0, NULL, feats, labels, NULL), 0);
    cr_assert(strstr(er_last_error(), "gold"), "%s", er_last_error());
    engine_free(&e);
    free(vq);
    free(p);
}
