// GRPO rollouts decoded together (rl/rollout.h) against the old loop, each group its own engine_generate:
// for fixed seeds every group's tokens, logprobs (bitwise), texts, answer offsets and finish reasons are
// the same, whether all groups fit the batch at once or queue for rows, and a group that cannot run
// fails the call cleanly (the error names it, every output freed, the batch empty and usable again).
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/quant.h"
#include "rl/rollout.h"
#include "tests/common/helpers.h"

static Model model;
static Tokenizer *tok;
static LoraAdapter ad;

static void setup(void) { helper_tiny_setup(&model, &tok, &ad); }
static void teardown(void) { helper_tiny_teardown(&model, tok, &ad); }
TestSuite(rollout_batch, .init = setup, .fini = teardown);

enum { NG = 6, GMAX = 3, MAX_LEN = 128, CHUNK = 16 };

// Prompts with no common prefix (the first group's is repeated by the last in queue_* below).
static const char *texts[NG] = {
    "Start with 7. Add 5. Multiply by 3. What is the result?",
    "Name a prime above 90 and below 100.",
    "What is 12 * 12? Answer briefly.",
    "Hi",
    "Count the letters in the word budget, then double it.",
    "Start with 7. Add 5. Multiply by 3. What is the result?",
};

typedef struct {
    int *ids[NG], n[NG];
    RolloutGroup g[NG];
    GenSample out[NG][GMAX];
} Groups;

// Groups of `samples[k]` samples (the masked adapter, the response prefix, the hard budget on some,
// different lengths, samplers and seeds), the first n of texts.
static void groups_init(Groups *s, int n, const int *samples) {
    memset(s, 0, sizeof *s);
    for (int k = 0; k < n; k++) {
        cr_assert_eq(tok_encode(tok, texts[k], strlen(texts[k]), &s->ids[k], &s->n[k]), 0);
        RolloutGroup *g = &s->g[k];
        g->prompt = s->ids[k];
        g->n_prompt = s->n[k];
        g->out = s->out[k];
        gen_config_default(&g->gc);
        g->gc.n_samples = samples[k];
        g->gc.max_new = 24 + 4 * k;
        g->gc.sampler.temperature = k == 3 ? 0.0f : 0.7f + 0.1f * k;
        g->gc.sampler.top_k = k % 2 ? 40 : 0;
        g->gc.seed = 100 + (uint64_t)k;
        g->gc.adapter = &ad;
        g->gc.response_prefix = "<think>\n";
        if (k % 2 == 0) {
            g->gc.budget = 6 + k;
            g->gc.answer_tokens = g->gc.max_new - g->gc.budget;
        }
    }
}

static void groups_free(Groups *s, int n) {
    for (int k = 0; k < n; k++) {
        gen_samples_free(s->out[k], s->g[k].gc.n_samples);
        free(s->ids[k]);
    }
}

// Group k as the old loop rolled it out: engine_generate on an engine of its own that first ran group
// `before` (-1 = none), as the batch's cached prompt it is prefilled from did.
static void alone(const Groups *s, int k, int before, GenSample *out) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, GMAX, MAX_LEN, CHUNK, 0), 0, "%s", er_last_error());
    GenStats st;
    if (before >= 0) {
        cr_assert_eq(engine_generate(&e, s->ids[before], s->n[before], &s->g[before].gc, NULL, NULL, out, &st), 0);
        gen_samples_free(out, s->g[before].gc.n_samples);
    }
    cr_assert_eq(engine_generate(&e, s->ids[k], s->n[k], &s->g[k].gc, NULL, NULL, out, &st), 0, "%s",
                 er_last_error());
    engine_free(&e);
}

static long assert_same(const GenSample *a, const GenSample *b, int n, int k) {
    long tokens = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(a[i].n_tokens, b[i].n_tokens, "group %d sample %d: %d tokens batched, %d alone", k, i,
                     a[i].n_tokens, b[i].n_tokens);
        for (int t = 0; t < a[i].n_tokens; t++) {
            cr_assert_eq(a[i].tokens[t], b[i].tokens[t], "group %d sample %d token %d", k, i, t);
            cr_assert(memcmp(&a[i].logprobs[t], &b[i].logprobs[t], sizeof(float)) == 0,
                      "group %d sample %d logprob %d: %.9g vs %.9g", k, i, t, a[i].logprobs[t], b[i].logprobs[t]);
        }
        cr_assert_eq(a[i].text_len, b[i].text_len, "group %d sample %d text length", k, i);
        cr_assert(memcmp(a[i].text, b[i].text, a[i].text_len) == 0, "group %d sample %d text", k, i);
        cr_assert_eq(a[i].finish, b[i].finish, "group %d sample %d finish", k, i);
        cr_assert_eq(a[i].budget_cut, b[i].budget_cut, "group %d sample %d budget cut", k, i);
        cr_assert_eq(a[i].answer_at, b[i].answer_at, "group %d sample %d answer_at", k, i);
        tokens += a[i].n_tokens;
    }
    return tokens;
}

// KV blocks held by anything but the batch's cached prompts (0 once every request ended).
static int blocks_outside_prompts(const DecodeBatch *b) {
    int cached = 0;
    for (int k = 0; k < b->n_prompts; k++)
        cached += b->prompts[k].slot >= 0 ? b->e.kv.seqs[b->prompts[k].slot].n_blocks : 0;
    return kv_cache_blocks_in_use(&b->e.kv) - cached;
}

// Runs groups 0..n-1 in a batch of `rows` rows and `prompts` cached prompts and checks each against
// the old loop (group `before[k]` run first on its engine); returns the forwards the batch ran.
static long check_against_loop(int n, const int *samples, const int *before, int rows, int prompts) {
    Groups s;
    groups_init(&s, n, samples);
    DecodeBatch b;
    cr_assert_eq(decode_batch_init(&b, &model, tok, &ad, KV_F32, rows, prompts, MAX_LEN, CHUNK, 0), 0, "%s",
                 er_last_error());
    long gen = 5; // rollout_groups adds to it
    cr_assert_eq(rollout_groups(&b, s.g, n, &gen), 0, "%s", er_last_error());
    cr_assert_eq(b.n_live, 0);
    cr_assert_eq(blocks_outside_prompts(&b), 0, "only the cached prompts hold KV once all groups ended");
    long tokens = 0, budget_cuts = 0;
    for (int k = 0; k < n; k++) {
        GenSample ref[GMAX];
        alone(&s, k, before[k], ref);
        tokens += assert_same(s.out[k], ref, samples[k], k);
        for (int i = 0; i < samples[k]; i++)
            budget_cuts += ref[i].budget_cut && ref[i].answer_at >= 0;
        gen_samples_free(ref, samples[k]);
    }
    cr_assert_eq(gen, 5 + tokens, "generated tokens");
    cr_assert_gt(budget_cuts, 0, "the hard budget must cut some samples (answer_at compared)");
    long steps = b.steps;
    cr_assert_lt(steps, tokens / 2, "%ld forwards for %ld tokens: the groups' rows must share them", steps, tokens);
    decode_batch_free(&b);
    groups_free(&s, n);
    return steps;
}

// 8 rows, all groups at once: the products take the decode kernels, bitwise as engine_generate's.
Test(rollout_batch, groups_decoded_together_equal_each_group_alone) {
    int samples[4] = {2, 3, 1, 2}, before[4] = {-1, -1, -1, -1};
    long steps = check_against_loop(4, samples, before, 8, 4);
    cr_assert_leq(steps, 24 + 4 * 3, "all groups in one batch: as many steps as the longest group");
}

// 15 rows, all groups at once: more than QUANT_DECODE_MAX_N rows a step, whose fp32 products (and the
// adapter's) stay on the decode kernels up to QUANT_BATCH_MAX_N rows, so still bitwise engine_generate's.
Test(rollout_batch, groups_past_eight_rows_equal_each_group_alone) {
    int samples[5] = {3, 3, 3, 3, 3}, before[5] = {-1, -1, -1, -1, -1};
    long steps = check_against_loop(5, samples, before, 15, 5);
    cr_assert_leq(steps, 24 + 4 * 4, "all groups in one batch: as many steps as the longest group");
}

// 4 rows for 13 samples: groups wait for rows as others leave, the last group repeats the first's
// prompt (prefilled from its cached KV, as the old loop's engine would after it).
Test(rollout_batch, groups_queued_for_rows_equal_each_group_alone) {
    int samples[NG] = {2, 3, 1, 2, 3, 2}, before[NG] = {-1, -1, -1, -1, -1, 0};
    check_against_loop(NG, samples, before, 4, NG);
}

static void assert_all_zero(const Groups *s, int n) {
    for (int k = 0; k < n; k++)
        for (int i = 0; i < s->g[k].gc.n_samples; i++)
            cr_assert(!s->out[k][i].tokens && !s->out[k][i].text && !s->out[k][i].logprobs &&
                          s->out[k][i].n_tokens == 0,
                      "group %d sample %d is not freed", k, i);
}

// A failure at group `bad` (its GenConfig made invalid by `spoil`): the error names the group, every
// output is freed and zeroed, no request or KV sequence is left, and the batch then runs a good call.
static void check_failure(int rows, int bad, void (*spoil)(GenConfig *), const char *what) {
    int samples[4] = {2, 1, 2, 2};
    Groups s;
    groups_init(&s, 4, samples);
    spoil(&s.g[bad].gc);
    DecodeBatch b;
    cr_assert_eq(decode_batch_init(&b, &model, tok, &ad, KV_F32, rows, 4, MAX_LEN, CHUNK, 0), 0);
    long gen = 0;
    cr_assert_lt(rollout_groups(&b, s.g, 4, &gen), 0);
    char want[64];
    snprintf(want, sizeof want, "rollout group %d: ", bad);
    cr_assert(strstr(er_last_error(), want) && strstr(er_last_error(), what), "error: %s", er_last_error());
    cr_assert_eq(gen, 0);
    cr_assert_eq(b.n_live, 0);
    cr_assert_eq(blocks_outside_prompts(&b), 0);
    assert_all_zero(&s, 4);
    groups_free(&s, 4);
    // The same batch still rolls out good groups.
    groups_init(&s, 4, samples);
    cr_assert_eq(rollout_groups(&b, s.g, 4, &gen), 0, "%s", er_last_error());
    cr_assert_gt(gen, 0);
    groups_free(&s, 4);
    decode_batch_free(&b);
}

static void too_long(GenConfig *g) { g->max_new = MAX_LEN; } // engine_check_generation refuses it
static void too_many(GenConfig *g) { g->n_samples = 3; }     // more than the 2-row batch holds
static void keeps_kv(GenConfig *g) { g->keep_kv = 1; } // the batch keeps no plain request's KV

// Refused while groups 0 and 1 decode (all fit at once).
Test(rollout_batch, failing_group_while_others_decode_frees_everything) {
    check_failure(8, 2, too_long, "exceed the");
}
// Refused once group 0 has ended (its outputs complete), while group 1 decodes and group 3 waits.
Test(rollout_batch, failing_queued_group_frees_finished_groups) { check_failure(3, 2, too_long, "exceed the"); }
Test(rollout_batch, group_larger_than_the_batch_is_refused) { check_failure(2, 3, too_many, "do not fit"); }
Test(rollout_batch, group_the_batch_cannot_run_is_refused) { check_failure(8, 1, keeps_kv, "keep"); }
