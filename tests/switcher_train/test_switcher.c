// Switcher data on a tiny random model: the derived label runs both routes; a missing gold answer or
// adapter is refused.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
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
    cr_assert_eq(switcher_derive_label(&e, p, n, &d, &r, "12", &label, &b, &a, &tokens), 0, "%s", er_last_error());
    cr_assert_eq(b, 0);
    cr_assert_eq(label, !b && a);
    cr_assert_gt(tokens, 0);
    cr_assert_lt(switcher_derive_label(&e, p, n, &d, &r, NULL, &label, NULL, NULL, NULL), 0);
    r.adapter = NULL;
    cr_assert_lt(switcher_derive_label(&e, p, n, &d, &r, "12", &label, NULL, NULL, NULL), 0);
    cr_assert(strstr(er_last_error(), "adapter"), "%s", er_last_error());
    engine_free(&e);
    free(p);
}
