// The generation engine on a tiny random model with the tiny tokenizer: what it samples agrees with
// the training forward, samples are reproducible and independent of the batch, the prompt is
// computed once and stored once, and the hard budget and stop strings hold.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "model/model.h"
#include "tests/common/helpers.h"
#include "tests/common/streamed.h"

static Model model;
static Tokenizer *tok;

static void setup(void) { helper_tiny_setup(&model, &tok, NULL); }
static void teardown(void) { helper_tiny_teardown(&model, tok, NULL); }
TestSuite(engine, .init = setup, .fini = teardown);

static int prompt_ids(const char *text, int **ids) {
    int n;
    cr_assert_eq(tok_encode(tok, text, strlen(text), ids, &n), 0);
    return n;
}

static const char *PROMPT = "Start with 7. Add 5. Multiply by 3. Subtract 4. What is the result?";

Test(engine, sampled_logprobs_equal_training_forward) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 3, 200, 16, 0), 0);
    int *p, n = prompt_ids(PROMPT, &p);
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 3;
    g.max_new = 24;
    g.sampler.temperature = 1.0f;
    g.seed = 11;
    GenSample out[3];
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0, "%s", er_last_error());
    for (int i = 0; i < 3; i++) {
        int L = n + out[i].n_tokens, V = model.cfg.V;
        int *all = malloc(sizeof(int) * L);
        memcpy(all, p, sizeof(int) * n);
        memcpy(all + n, out[i].tokens, sizeof(int) * out[i].n_tokens);
        Activations a;
        cr_assert_eq(acts_alloc(&a, &model.cfg, 1, L, ACTS_SCORE, 0), 0);
        ModelInput in = {.B = 1, .T = L, .tokens = all};
        cr_assert_eq(model_forward(&model, &in, &a), 0);
        for (int j = 0; j < out[i].n_tokens; j++) {
            const float *row = a.logits + (size_t)(n + j - 1) * V;
            double mx = -1e30, z = 0;
            for (int v = 0; v < V; v++)
                mx = fmax(mx, row[v]);
            for (int v = 0; v < V; v++)
                z += exp(row[v] - mx);
            double ref = row[out[i].tokens[j]] - mx - log(z);
            cr_assert(fabs(out[i].logprobs[j] - ref) <= 1e-4 * (1 + fabs(ref)), "sample %d token %d: %g vs %g", i, j,
                      out[i].logprobs[j], ref);
        }
        acts_free(&a);
        free(all);
    }
    gen_samples_free(out, 3);
    free(p);
    engine_free(&e);
}

// Sample i draws from stream i of the seed: the same tokens run to run, and whether it is decoded
// alone or in a batch of four.
Test(engine, samples_reproducible_and_batch_independent) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 4, 200, 16, 0), 0);
    int *p, n = prompt_ids(PROMPT, &p);
    GenConfig g;
    gen_config_default(&g);
    g.max_new = 20;
    g.sampler.temperature = 0.9f;
    g.sampler.top_p = 0.95f;
    g.seed = 5;
    GenSample a[4], b[4], one[1];
    GenStats st;
    g.n_samples = 4;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, a, &st), 0);
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, b, &st), 0);
    g.n_samples = 1;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, one, &st), 0);
    int differ = 0;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(a[i].n_tokens, b[i].n_tokens);
        cr_assert_arr_eq(a[i].tokens, b[i].tokens, sizeof(int) * a[i].n_tokens, "sample %d not reproducible", i);
        if (i > 0 && (a[i].n_tokens != a[0].n_tokens || memcmp(a[i].tokens, a[0].tokens, sizeof(int) * a[0].n_tokens)))
            differ = 1;
    }
    cr_assert(differ, "different samples must draw different streams");
    cr_assert_eq(one[0].n_tokens, a[0].n_tokens);
    cr_assert_arr_eq(one[0].tokens, a[0].tokens, sizeof(int) * one[0].n_tokens, "sample 0 alone vs in a batch of 4");
    gen_samples_free(a, 4);
    gen_samples_free(b, 4);
    gen_samples_free(one, 1);
    free(p);
    engine_free(&e);
}

// The prompt runs through the forward once and is stored once; a longer follow-up prompt reuses it.
Test(engine, prefix_computed_and_stored_once) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 4, 400, 32, 0), 0);
    char text[2048] = "";
    for (int i = 0; i < 6; i++)
        strcat(text, PROMPT);
    int *p, n = prompt_ids(text, &p);
    cr_assert(n > 3 * KV_BLOCK, "the prompt must span several blocks (%d tokens)", n);
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 4;
    g.max_new = 10;
    g.sampler.temperature = 1.0f;
    GenSample out[4];
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0);
    long decoded = 0;
    for (int i = 0; i < 4; i++)
        decoded += out[i].n_tokens - 1; // the last token of a finished sample is not run
    cr_assert_eq(st.forward_positions, n + decoded, "forward positions %ld: the prompt must run once", st.forward_positions);
    size_t block = kv_bytes_per_position(&model.cfg, KV_F32) * KV_BLOCK;
    int prompt_blocks = (n + KV_BLOCK - 1) / KV_BLOCK;
    // Prompt blocks once, plus per sample its copy of the prompt's last block and at most one more.
    cr_assert(st.kv_bytes <= (size_t)(prompt_blocks + 2 * 4) * block, "KV bytes %zu for %d prompt blocks", st.kv_bytes,
              prompt_blocks);
    cr_assert(st.kv_bytes < (size_t)(4 * prompt_blocks) * block, "the prefix must not be stored per sample");
    gen_samples_free(out, 4);

    // Follow-up: the old prompt is a prefix of the new one and is not recomputed.
    strcat(text, " And then add 1.");
    int *p2, n2 = prompt_ids(text, &p2);
    g.n_samples = 1;
    cr_assert_eq(engine_generate(&e, p2, n2, &g, NULL, NULL, out, &st), 0);
    cr_assert(st.prompt_reused >= n - 1 && st.prompt_reused < n2, "reused %d of %d", st.prompt_reused, n2);
    cr_assert_eq(st.forward_positions, n2 - st.prompt_reused + out[0].n_tokens - 1);
    gen_samples_free(out, 1);
    free(p);
    free(p2);
    engine_free(&e);
}

// The tiny tokenizer's single token for "</think>".
static int think_close_id(void) {
    int *ids, n = prompt_ids("</think>", &ids), id = ids[0];
    cr_assert_eq(n, 1);
    free(ids);
    return id;
}

Test(engine, hard_budget_and_stop_strings) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_INT8, 3, 300, 16, 0), 0);
    int *p, n = prompt_ids(PROMPT, &p);
    int *suf, ns;
    const char *suffix = "\n</think>\n\nFinal answer: ";
    cr_assert_eq(tok_encode(tok, suffix, strlen(suffix), &suf, &ns), 0);
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 3;
    g.max_new = 200;
    g.sampler.temperature = 1.0f;
    g.budget = 8;
    g.answer_tokens = ns + 6;
    // The budget bounds the think length: the suffix starts early enough for its "</think>" to end at B.
    int close = 0;
    for (int j = 0; j < ns && !close; j++)
        if (suf[j] == think_close_id())
            close = j + 1;
    cr_assert_gt(close, 0, "the suffix's </think> is one token of the tiny tokenizer");
    GenSample out[3];
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0, "%s", er_last_error());
    int cut = 0;
    for (int i = 0; i < 3; i++) {
        cr_assert(out[i].n_tokens <= g.budget + g.answer_tokens, "sample %d: %d tokens", i, out[i].n_tokens);
        if (out[i].budget_cut) {
            cut++;
            cr_assert_arr_eq(out[i].tokens + g.budget - close, suf, sizeof(int) * ns,
                             "the suffix closes at the budget");
            cr_assert_eq(out[i].think_len, g.budget, "sample %d: a forced sample's think length is the budget", i);
            cr_assert(strstr(out[i].text, "Final answer: "), "text: %s", out[i].text);
        }
    }
    cr_assert(cut > 0, "a random model should run into the budget");
    gen_samples_free(out, 3);
    // A stop string inside the forced suffix: the text is cut where it starts.
    const char *stops[] = {"Final answer"};
    g.stop = stops;
    g.n_stop = 1;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0);
    for (int i = 0; i < 3; i++)
        if (out[i].budget_cut) {
            cr_assert_eq(out[i].finish, FINISH_STOP);
            cr_assert(!strstr(out[i].text, "Final"), "text must be cut before the stop string: %s", out[i].text);
        }
    gen_samples_free(out, 3);
    // A budget that cannot hold the suffix through its </think> is refused.
    g.stop = NULL;
    g.n_stop = 0;
    g.budget = close - 1;
    cr_assert(engine_generate(&e, p, n, &g, NULL, NULL, out, &st) < 0);
    cr_assert(strstr(er_last_error(), "cannot hold the forced suffix"), "%s", er_last_error());
    g.budget = 8;
    // An answer allowance shorter than the suffix is refused.
    g.answer_tokens = ns;
    cr_assert(engine_generate(&e, p, n, &g, NULL, NULL, out, &st) < 0);
    cr_assert(strstr(er_last_error(), "answer allowance"), "%s", er_last_error());
    free(suf);
    free(p);
    engine_free(&e);
}

// A sample whose own output closes its think block before the budget is never forced afterwards: it
// runs on to the token limit (B + A) with its think length where it closed. The random tiny model
// writes the "</think>" token now and then: a few seeds find samples that do (checked, not assumed).
Test(engine, closed_think_block_is_never_forced) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 8, 200, 16, 0), 0);
    int *p, n = prompt_ids(PROMPT, &p), close_id = think_close_id();
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 8;
    g.max_new = 100;
    g.sampler.temperature = 1.5f;
    g.budget = 40;
    g.answer_tokens = 20;
    g.response_prefix = "<think>\n";
    int closed_early = 0, ran_past = 0, forced = 0;
    for (uint64_t seed = 0; seed < 40 && ran_past < 2; seed++) {
        g.seed = seed;
        GenSample out[8];
        GenStats st;
        cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0, "%s", er_last_error());
        for (int i = 0; i < 8; i++) {
            const GenSample *o = &out[i];
            int first = -1; // the first "</think>" the model wrote, before any forcing
            for (int t = 0; t < o->n_tokens && first < 0; t++)
                if (o->tokens[t] == close_id)
                    first = t;
            forced += o->budget_cut;
            if (o->budget_cut) {
                cr_assert_eq(o->think_len, g.budget, "seed %d sample %d", (int)seed, i);
                continue;
            }
            if (first < 0 || first + 1 >= g.budget)
                continue;
            closed_early++;
            cr_assert_eq(o->think_len, first + 1, "seed %d sample %d: L ends at its own </think>", (int)seed, i);
            if (o->n_tokens > g.budget) { // past B without the suffix: nothing was forced after the close
                ran_past++;
                cr_assert(!strstr(o->text, "Final answer: "), "seed %d sample %d: %s", (int)seed, i, o->text);
            }
        }
        gen_samples_free(out, 8);
    }
    cr_assert_gt(ran_past, 0, "no sample closed its think block before the budget and ran past it (%d closed): the "
                 "test proves nothing", closed_early);
    cr_assert_gt(forced, 0, "no sample was forced: the budget was never reached");
    free(p);
    engine_free(&e);
}

// A session that does not fit is refused before anything is allocated, with the estimate; so is one
// longer than the model's positions, and one whose size overflows an int (4 x 2^30 positions).
Test(engine, refuses_sessions_that_do_not_fit) {
    Engine e;
    cr_assert(engine_init(&e, &model, tok, KV_F32, 8, 1000, 128, 1u << 20) < 0);
    cr_assert(strstr(er_last_error(), "MiB"), "%s", er_last_error());
    cr_assert(engine_init(&e, &model, tok, KV_F32, 1, model.cfg.max_pos + 1, 128, 0) < 0);
    cr_assert(strstr(er_last_error(), "max_position_embeddings"), "%s", er_last_error());
    Model wide = model;
    wide.cfg.max_pos = 2147483647;
    cr_assert(engine_init(&e, &wide, tok, KV_F32, 4, 1073741825, 128, er_physical_memory()) < 0);
    cr_assert(strstr(er_last_error(), "MiB") || strstr(er_last_error(), "address"), "%s", er_last_error());
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 2, 200, 16, 64u << 20), 0, "%s", er_last_error());
    engine_free(&e);
}

// An adapter replaced in place (same struct, new contents, as er_model_load_adapter does) is told
// apart from the old one: the prompt K/V cached under the old unmasked adapter are not reused, so
// the first token's log-prob is the new adapter's (a fresh engine's) and not the old one's.
Test(engine, replaced_adapter_recomputes_the_prompt) {
    LoraAdapter ad;
    helper_random_adapter(&ad, &model.cfg, 0.5f, 21);
    ad.masked = 0;
    Engine e, f;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 1, 200, 16, 0), 0);
    cr_assert_eq(engine_init(&f, &model, tok, KV_F32, 1, 200, 16, 0), 0);
    int *p, n = prompt_ids(PROMPT, &p);
    GenConfig g;
    gen_config_default(&g);
    g.max_new = 4;
    g.adapter = &ad;
    GenSample old_out, new_out, fresh_out;
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, &old_out, &st), 0, "%s", er_last_error());
    lora_free(&ad);
    helper_random_adapter(&ad, &model.cfg, 0.5f, 22);
    ad.masked = 0;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, &new_out, &st), 0, "%s", er_last_error());
    cr_assert_eq(st.prompt_reused, 0);
    cr_assert_eq(engine_generate(&f, p, n, &g, NULL, NULL, &fresh_out, &st), 0, "%s", er_last_error());
    cr_assert_eq(new_out.logprobs[0], fresh_out.logprobs[0], "new %g vs fresh %g", new_out.logprobs[0],
                 fresh_out.logprobs[0]);
    cr_assert_neq(new_out.logprobs[0], old_out.logprobs[0], "the two adapters give the same log-prob");
    gen_samples_free(&old_out, 1);
    gen_samples_free(&new_out, 1);
    gen_samples_free(&fresh_out, 1);
    free(p);
    engine_free(&e);
    engine_free(&f);
    lora_free(&ad);
}

// The streamed bytes equal the final text exactly: with stop strings that straddle token boundaries
// (their first bytes must not be streamed before the match is known), with the hard budget, and
// when the callback itself stops a sample. The random model emits byte tokens, so invalid UTF-8
// (repaired to U+FFFD the same way in both) occurs too.
Test(engine, streamed_text_equals_final_text) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 3, 300, 16, 0), 0);
    int *p, n = prompt_ids(PROMPT, &p);
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 3;
    g.max_new = 60;
    g.sampler.temperature = 1.0f;
    g.seed = 5;
    GenSample out[3];
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, out, &st), 0, "%s", er_last_error());
    // Stop strings made of the last 2 bytes of one token and the first 2 of the next, in each sample.
    char stops[3][8];
    const char *stop_ptrs[3];
    int n_stops = 0;
    for (int i = 0; i < 3 && n_stops < 3; i++) {
        size_t at = 0;
        for (int k = 0; k + 1 < out[i].n_tokens; k++) {
            size_t a, b;
            const char *x = tok_token_bytes(tok, out[i].tokens[k], &a);
            const char *y = tok_token_bytes(tok, out[i].tokens[k + 1], &b);
            at += x ? a : 0;
            if (k >= 6 && x && y && a >= 2 && b >= 2 && memchr(x, 0, a) == NULL && memchr(y, 0, 2) == NULL) {
                memcpy(stops[n_stops], x + a - 2, 2);
                memcpy(stops[n_stops] + 2, y, 2);
                stops[n_stops][4] = 0;
                stop_ptrs[n_stops] = stops[n_stops];
                n_stops++;
                break;
            }
        }
    }
    gen_samples_free(out, 3);
    cr_assert_gt(n_stops, 0, "no token pair to build a stop string from");
    for (int mode = 0; mode < 3; mode++) {
        g.stop = mode == 0 ? stop_ptrs : NULL;
        g.n_stop = mode == 0 ? n_stops : 0;
        g.budget = mode == 1 ? 10 : 0;
        g.answer_tokens = 16;
        Streamed s;
        memset(&s, 0, sizeof s);
        s.stop_after = mode == 2 ? 7 : 0;
        cr_assert_eq(engine_generate(&e, p, n, &g, streamed_collect, &s, out, &st), 0, "%s", er_last_error());
        int stopped = 0;
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(s.calls[i], out[i].n_tokens, "mode %d sample %d: one call per token", mode, i);
            cr_assert(s.len[i] == out[i].text_len && memcmp(s.buf[i], out[i].text, s.len[i]) == 0,
                      "mode %d sample %d: streamed \"%.*s\" but the text is \"%s\"", mode, i, (int)s.len[i], s.buf[i],
                      out[i].text);
            stopped += out[i].finish == FINISH_STOP;
        }
        if (mode == 0)
            cr_assert_gt(stopped, 0, "no sample hit its stop string");
        if (mode == 2)
            cr_assert(out[0].finish == FINISH_STOP && out[0].n_tokens == 7, "the callback's stop: %d tokens",
                      out[0].n_tokens);
        gen_samples_free(out, 3);
    }
    free(p);
    engine_free(&e);
}

// Logits that turn NaN mid-generation (an in-memory model; files with NaN weights are refused at
// load) are an error naming the sample and the position, not "token 0" of the vocabulary alone.
Test(engine, nan_logits_name_the_sample) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 2, 200, 16, 0), 0);
    int *p, n = prompt_ids(PROMPT, &p);
    model.norm[0] = NAN;
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 2;
    g.max_new = 4;
    GenSample out[2];
    GenStats st;
    cr_assert(engine_generate(&e, p, n, &g, NULL, NULL, out, &st) < 0);
    cr_assert(strstr(er_last_error(), "sample 0, new token 1") && strstr(er_last_error(), "NaN"), "%s",
              er_last_error());
    free(p);
    engine_free(&e);
}

static int poison_after_first(void *user, int sample, int token, const char *bytes, size_t n) {
    (void)user, (void)sample, (void)token, (void)bytes, (void)n;
    model.norm[0] = NAN; // the next decode step's logits are all NaN
    return 0;
}

// The same in a decode step, where the rows are sampled on two threads at once: every row fails, and the
// error is the lowest row's, named as the serial loop named it.
Test(engine, nan_logits_in_a_parallel_step_name_the_first_sample) {
    threads_set(2);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 4, 200, 16, 0), 0);
    cr_assert_eq(e.n_samplers, 2);
    int *p, n = prompt_ids(PROMPT, &p);
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 4;
    g.max_new = 4;
    GenSample out[4];
    GenStats st;
    float keep = model.norm[0];
    int rc = engine_generate(&e, p, n, &g, poison_after_first, NULL, out, &st);
    model.norm[0] = keep;
    cr_assert(rc < 0);
    cr_assert(strstr(er_last_error(), "sample 0, new token 2") && strstr(er_last_error(), "NaN"), "%s",
              er_last_error());
    free(p);
    engine_free(&e);
}
