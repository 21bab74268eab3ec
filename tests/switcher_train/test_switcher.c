// Switcher data on a tiny random model: the derived label runs both routes; a missing gold answer or
// adapter is refused.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "switcher_train/switcher.h"
#include "tests/common/helpers.h"

static Model model;
static Tokenizer *tok;
static LoraAdapter ad;

static void setup(void) { helper_tiny_setup(&model, &tok, &ad); }
static void teardown(void) { helper_tiny_teardown(&model, tok, &ad); }
TestSuite(switcher_data, .init = setup, .fini = teardown);

static const char *PROMPT = "Start with 7. Add 5. What is the result?";

Test(switcher_data, label_runs_both_routes) {
    int *p, n;
    cr_assert_eq(tok_encode(tok, PROMPT, strlen(PROMPT), &p, &n), 0);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 1, 128, 16, 0), 0);
    GenConfig d, r;
    gen_config_default(&d);
    d.max_new = 6;
    gen_config_default(&r);
    r.max_new = 10;
    r.adapter = &ad;
    r.response_prefix = "<think>\n";
    int label = -1, b = -1, a = -1;
    long tokens = 0;
    // A random model gets neither right: no reasoning needed by this rule.
    cr_assert_eq(switcher_derive_label(&e, p, n, &d, &r, 0, "12", &label, &b, &a, &tokens), 0, "%s", er_last_error());
    cr_assert_eq(b, 0);
    cr_assert_eq(label, !b && a);
    cr_assert_gt(tokens, 0);
    cr_assert_lt(switcher_derive_label(&e, p, n, &d, &r, 0, NULL, &label, NULL, NULL, NULL), 0);
    r.adapter = NULL;
    cr_assert_lt(switcher_derive_label(&e, p, n, &d, &r, 0, "12", &label, NULL, NULL, NULL), 0);
    cr_assert(strstr(er_last_error(), "adapter"), "%s", er_last_error());
    engine_free(&e);
    free(p);
}

// A hybrid base: the labels run its thinking switch without an adapter, each route exactly as the base
// continues the prompt and that route's think block.
Test(switcher_data, hybrid_labels_run_the_thinking_switch) {
    int *p, n;
    cr_assert_eq(tok_encode(tok, PROMPT, strlen(PROMPT), &p, &n), 0);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 1, 128, 16, 0), 0);
    GenConfig d, r;
    gen_config_default(&d);
    d.max_new = 6;
    gen_config_default(&r);
    r.max_new = 10;
    r.response_prefix = CHAT_THINK_ON; // no adapter: the base thinks
    int label = -1, b = -1, a = -1;
    long tokens = 0;
    cr_assert_eq(switcher_derive_label(&e, p, n, &d, &r, 1, "12", &label, &b, &a, &tokens), 0, "%s", er_last_error());
    cr_assert_eq(label, !b && a);
    cr_assert_gt(tokens, 0);
    // The direct answer's tokens are those after the prompt and the empty think block.
    GenConfig off = d;
    off.response_prefix = CHAT_THINK_OFF;
    off.sampler.temperature = 0;
    GenSample s;
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &off, NULL, NULL, &s, &st), 0, "%s", er_last_error());
    long want = s.n_tokens;
    gen_samples_free(&s, 1);
    r.response_prefix = CHAT_THINK_ON;
    r.sampler.temperature = 0;
    cr_assert_eq(engine_generate(&e, p, n, &r, NULL, NULL, &s, &st), 0, "%s", er_last_error());
    want += s.n_tokens;
    gen_samples_free(&s, 1);
    cr_expect_eq(tokens, want, "the two routes' greedy answers, thinking off then on");
    engine_free(&e);
    free(p);
}
