// The routed pipeline (infer/pipeline.h) and its C API: voting on hand-made cases (ties, no answer,
// one sample, equivalent spellings), routing by the switcher's threshold, verifier scores equal to
// the head on the engine's verification features, the prompt computed once for both routes, and
// the public API (heads loaded for the right model only, ErRoute filled).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/grade.h"
#include "infer/erinfer.h"
#include "infer/pipeline.h"
#include "tests/common/api_helpers.h"
#include "tests/common/heads_helpers.h"

// ---- voting ----

static int vote(char **answers, const float *w, int n, Vote **v, int *nv) {
    int winner;
    cr_assert_eq(pipeline_vote(answers, w, w, n, v, nv, &winner), 0);
    return winner;
}

Test(vote, weighted_majority_beats_count) {
    char *a[] = {"12", "7", "7", "12", "7"};
    float w[] = {0.9f, 0.2f, 0.3f, 0.8f, 0.1f};
    Vote *v;
    int nv, win = vote(a, w, 5, &v, &nv);
    cr_assert_eq(nv, 2);
    cr_assert_str_eq(v[win].answer, "12", "1.7 beats 0.6 although 7 has more votes");
    cr_assert_eq(v[win].count, 2);
    cr_assert_float_eq(v[win].weight, 1.7, 1e-6);
    votes_free(v, nv);
    int w2;
    cr_assert_eq(pipeline_vote(a, NULL, NULL, 5, &v, &nv, &w2), 0);
    cr_assert_str_eq(v[w2].answer, "7", "unweighted: the plain majority");
    votes_free(v, nv);
}

Test(vote, ties_go_to_the_highest_single_score_then_the_earliest) {
    char *a[] = {"3", "5", "5", "3"};
    float w[] = {0.5f, 0.25f, 0.25f, 0.5f}; // 1.0 each
    float w_tie[] = {0.5f, 0.7f, 0.3f, 0.5f}; // 1.0 each, 5 has the best single score
    Vote *v;
    int nv, win = vote(a, w, 4, &v, &nv);
    cr_assert_str_eq(v[win].answer, "3", "same sums: 3 has the higher single score");
    votes_free(v, nv);
    win = vote(a, w_tie, 4, &v, &nv);
    cr_assert_str_eq(v[win].answer, "5");
    votes_free(v, nv);
    float same[] = {0.5f, 0.5f, 0.5f, 0.5f};
    win = vote(a, same, 4, &v, &nv);
    cr_assert_str_eq(v[win].answer, "3", "a full tie: the earliest answer");
    votes_free(v, nv);
}

Test(vote, no_answers_single_sample_and_equivalent_spellings) {
    char *none[] = {NULL, NULL};
    float w[] = {0.9f, 0.8f, 0.7f};
    Vote *v;
    int nv, win = vote(none, w, 2, &v, &nv);
    cr_assert_eq(win, -1);
    cr_assert_eq(nv, 0);
    votes_free(v, nv);
    char *one[] = {"42"};
    win = vote(one, w, 1, &v, &nv);
    cr_assert_eq(nv, 1);
    cr_assert_str_eq(v[win].answer, "42");
    votes_free(v, nv);
    char *mixed[] = {"0.5", NULL, "\\frac{1}{2}"};
    win = vote(mixed, w, 3, &v, &nv);
    cr_assert_eq(nv, 1, "0.5 and \\frac{1}{2} are one answer");
    cr_assert_eq(v[win].count, 2);
    cr_assert_str_eq(v[win].answer, "0.5");
    votes_free(v, nv);
    // All wrong: the vote still picks one; grading says it is wrong.
    char *wrong[] = {"1", "2", "2"};
    win = vote(wrong, w, 3, &v, &nv);
    cr_assert_eq(grade_answer_correct(v[win].answer, "9"), 0);
    votes_free(v, nv);
    cr_assert_eq(grade_answer_correct("18", "\\boxed{18}"), 1);
    cr_assert_eq(grade_answer_correct("18", "so #### 18"), 1);
    cr_assert_eq(grade_answer_correct(NULL, "18"), 0);
}

// Samples cut by the budget that run on after the forced answer vote for the answer they gave:
// "36, 36 + 5 = 43, 43 + 5 =" is 36 (it was a vote of its own, matching nothing).
Test(vote, run_on_answers_after_the_forced_suffix) {
    const char *texts[] = {"6 * 6 = 36\n</think>\n\nFinal answer: 36, 36 + 5 = 43, 43 + 5 =",
                           "6 * 6 = 36\n</think>\n\nFinal answer: 36.\nAnswer: 41",
                           "6 * 6 = 36\n</think>\n\nFinal answer: 41"};
    char *answers[3];
    for (int i = 0; i < 3; i++) {
        long at = (long)(strstr(texts[i], "Final answer: ") - texts[i]) + 14;
        cr_assert_eq(grade_answer(texts[i], at, 0, &answers[i]), ER_OK);
    }
    float w[] = {0.5f, 0.5f, 0.6f};
    Vote *v;
    int nv, win = vote(answers, w, 3, &v, &nv);
    cr_assert_eq(nv, 2, "36 and 41: %d groups", nv);
    cr_assert_eq(grade_answer_correct(v[win].answer, "36"), 1, "winner %s", v[win].answer);
    cr_assert_eq(v[win].count, 2);
    votes_free(v, nv);
    for (int i = 0; i < 3; i++)
        er_free(answers[i]);
}

// ---- the pipeline on a tiny model ----

static Model model;
static Tokenizer *tok;
static LoraAdapter ad;
static TrainedHead sw, vf;

static void setup(void) {
    helper_tiny_setup(&model, &tok, &ad);
    const ModelConfig *c = &model.cfg;
    memset(&sw, 0, sizeof sw);
    memset(&vf, 0, sizeof vf);
    cr_assert_eq(head_init(&sw.net, HEAD_MLP, c->C, 8, 0.2f, 0, 1), 0);
    sw.role = HEAD_SWITCHER;
    sw.chunk = 8;
    sw.alpha = 0.5f;
    cr_assert_eq(head_init(&vf.net, HEAD_LINEAR, c->C, 1, 0, 0, 2), 0);
    vf.role = HEAD_VERIFIER;
    vf.verify_prompt = er_strdup("\nIs this solution correct?");
}
static void teardown(void) {
    trained_head_free(&sw);
    trained_head_free(&vf);
    helper_tiny_teardown(&model, tok, &ad);
}
TestSuite(pipeline, .init = setup, .fini = teardown);

static const char *PROMPT = "Start with 7. Add 5. Multiply by 3. Subtract 4. What is the result?";

static PipelineConfig config(int n) {
    PipelineConfig c = {&sw, &vf, {0}, {0}, PIPELINE_AUTO, 0};
    gen_config_default(&c.direct);
    c.direct.max_new = 8;
    gen_config_default(&c.reasoning);
    c.reasoning.n_samples = n;
    c.reasoning.max_new = 12;
    c.reasoning.sampler.temperature = 0.8f;
    c.reasoning.seed = 5;
    c.reasoning.adapter = &ad;
    c.reasoning.response_prefix = "<think>\n";
    return c;
}

Test(pipeline, routes_by_the_switcher_threshold) {
    int *p, n;
    cr_assert_eq(tok_encode(tok, PROMPT, strlen(PROMPT), &p, &n), 0);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 4, 256, 16, 0), 0);
    PipelineConfig c = config(4);
    GenSample out[4];
    PipelineResult r;
    // Threshold above any score: direct, one greedy base sample, no verifier.
    sw.threshold = 1.0f;
    cr_assert_eq(pipeline_run(&e, p, n, &c, NULL, NULL, out, &r), 0, "%s", er_last_error());
    cr_assert_eq(r.route, ROUTE_DIRECT);
    cr_assert(r.switcher_score > 0 && r.switcher_score < 1);
    cr_assert_eq(r.n, 1);
    cr_assert_null(r.verifier_scores);
    cr_assert_eq(r.gen.prompt_reused, n, "the switcher's prefill is reused whole");
    float score = r.switcher_score;
    gen_samples_free(out, r.n);
    pipeline_result_free(&r);
    // Threshold at the score: reasoning, 4 samples, one verifier score each.
    sw.threshold = score;
    long fp0 = e.forward_positions;
    cr_assert_eq(pipeline_run(&e, p, n, &c, NULL, NULL, out, &r), 0, "%s", er_last_error());
    cr_assert_eq(r.route, ROUTE_REASONING);
    cr_assert_float_eq(r.switcher_score, score, 0, "the same prompt, the same features");
    cr_assert_eq(r.n, 4);
    cr_assert_not_null(r.verifier_scores);
    cr_assert_eq(r.gen.prompt_reused, n);
    cr_assert_eq(r.forward_positions, e.forward_positions - fp0);
    int *vq, nv, *pre, npre;
    cr_assert_eq(tok_encode(tok, vf.verify_prompt, strlen(vf.verify_prompt), &vq, &nv), 0);
    cr_assert_eq(tok_encode(tok, "<think>\n", 8, &pre, &npre), 0);
    long decoded = 0;
    for (int i = 0; i < 4; i++) // a sample's last token is fed only for verification, and never an EOS
        decoded += out[i].n_tokens - 1 + nv + !tok_is_eos(tok, out[i].tokens[out[i].n_tokens - 1]);
    cr_assert_eq(r.forward_positions, n + npre + decoded,
                 "prompt once, prefix once, each sample's tokens, verification tokens: nothing recomputed");
    // The verifier scores are the head on the engine's features, sample by sample.
    GenSample again[4];
    GenConfig g = c.reasoning;
    g.keep_kv = 1;
    GenStats st;
    cr_assert_eq(engine_generate(&e, p, n, &g, NULL, NULL, again, &st), 0);
    for (int i = 0; i < 4; i++) {
        cr_assert_arr_eq(again[i].tokens, out[i].tokens, sizeof(int) * out[i].n_tokens);
        float feat[32], pv;
        cr_assert_eq(engine_verify_features(&e, i, vq, nv, 0, feat), 0);
        cr_assert_eq(head_predict(&vf.net, feat, 1, &pv), 0);
        cr_assert_float_eq(r.verifier_scores[i], pv, 1e-6);
    }
    engine_release_samples(&e);
    gen_samples_free(again, 4);
    gen_samples_free(out, r.n);
    pipeline_result_free(&r);
    // No switcher: always reasoning; no adapter: always direct.
    c.switcher = NULL;
    cr_assert_eq(pipeline_run(&e, p, n, &c, NULL, NULL, out, &r), 0);
    cr_assert_eq(r.route, ROUTE_REASONING);
    cr_assert_float_eq(r.switcher_score, -1, 0);
    gen_samples_free(out, r.n);
    pipeline_result_free(&r);
    c.reasoning.adapter = NULL;
    c.switcher = &sw;
    sw.threshold = 0;
    cr_assert_eq(pipeline_run(&e, p, n, &c, NULL, NULL, out, &r), 0);
    cr_assert_eq(r.route, ROUTE_DIRECT);
    gen_samples_free(out, r.n);
    pipeline_result_free(&r);
    engine_free(&e);
    free(vq);
    free(pre);
    free(p);
}

// The vote reads each sample's answer after its think block (opened by the reasoning prefix): a sample
// forced to answer without closing it gives no answer; one whose suffix closes it votes.
Test(pipeline, unclosed_think_blocks_do_not_vote) {
    int *p, n;
    cr_assert_eq(tok_encode(tok, PROMPT, strlen(PROMPT), &p, &n), 0);
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, KV_F32, 4, 256, 16, 0), 0);
    PipelineConfig c = config(4);
    c.switcher = NULL;
    const char *suffixes[2] = {" \\boxed{12}", "\n</think>\n\n\\boxed{12}"};
    for (int k = 0; k < 2; k++) {
        int *ids, ns;
        cr_assert_eq(tok_encode(tok, suffixes[k], strlen(suffixes[k]), &ids, &ns), 0);
        free(ids);
        c.reasoning.budget_suffix = suffixes[k];
        c.reasoning.budget = 3;
        c.reasoning.answer_tokens = ns + 2;
        c.reasoning.max_new = c.reasoning.budget + c.reasoning.answer_tokens;
        GenSample out[4];
        PipelineResult r;
        cr_assert_eq(pipeline_run(&e, p, n, &c, NULL, NULL, out, &r), 0, "%s", er_last_error());
        cr_assert_eq(r.route, ROUTE_REASONING);
        int cut = 0;
        for (int i = 0; i < 4; i++) {
            const char *close = strstr(out[i].text, "</think>"), *forced = "</think>\n\n\\boxed{12}";
            int own = k == 0 ? close != NULL : !close || strncmp(close, forced, strlen(forced)) != 0;
            if (!out[i].budget_cut || own)
                continue; // finished early, or the model closed the block itself
            cut++;
            if (k == 0)
                cr_assert_null(r.answers[i], "sample %d voted \"%s\" from inside its think block: %s", i,
                               r.answers[i], out[i].text);
            else
                cr_assert(r.answers[i] && strcmp(r.answers[i], "12") == 0, "sample %d: [%s] %s", i,
                          r.answers[i] ? r.answers[i] : "(none)", out[i].text);
        }
        cr_assert_gt(cut, 0, "no sample was forced to answer");
        if (k == 0 && cut == 4)
            cr_assert_eq(r.winner, -1, "no sample has an answer");
        gen_samples_free(out, r.n);
        pipeline_result_free(&r);
    }
    engine_free(&e);
    free(p);
}

// ---- the C API ----

Test(pipeline, c_api_loads_heads_and_reports_the_route) {
    char *tmp = helper_tmpdir("er_pipe_api_");
    heads_make_model_and_adapter(tmp);
    char model_dir[512], adapter_dir[512], swp[512], vfp[512];
    snprintf(model_dir, sizeof model_dir, "%s/model", tmp);
    snprintf(adapter_dir, sizeof adapter_dir, "%s/adapter", tmp);
    snprintf(swp, sizeof swp, "%s/sw.safetensors", tmp);
    snprintf(vfp, sizeof vfp, "%s/vf.safetensors", tmp);
    heads_write_random_heads(tmp, "sw.safetensors", "vf.safetensors", 0, "\nCorrect?"); // 0: every query reasons

    ErModel *m;
    ErSession *s;
    cr_assert_eq(er_model_load(&m, model_dir), 0, "%s", er_last_error());
    cr_assert_lt(er_model_load_switcher(m, vfp), 0, "a verifier is not a switcher");
    cr_assert_eq(er_model_load_adapter(m, adapter_dir), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&s, m, 3, 256, 1), 0, "%s", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    p.n_samples = 3;
    p.max_new_tokens = 10;
    p.temperature = 0.8f;
    ErMessage msg = {"user", "What is 2 + 3?"};
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), 0);
    cr_assert_null(er_result_route(s), "no heads: no pipeline");
    cr_assert_eq(er_model_load_switcher(m, swp), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_verifier(m, vfp), 0, "%s", er_last_error());
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), 0, "%s", er_last_error());
    const ErRoute *r = er_result_route(s);
    cr_assert_not_null(r);
    cr_assert_eq(r->route, ER_ROUTE_REASONING);
    cr_assert(r->switcher_score >= 0 && r->switcher_score <= 1);
    cr_assert_eq(er_result_count(s), 3);
    cr_assert_not_null(r->verifier_scores);
    for (int i = 0; i < 3; i++)
        cr_assert(r->verifier_scores[i] > 0 && r->verifier_scores[i] < 1);
    cr_assert_not_null(r->answers);
    cr_assert_geq(r->n_votes, 0);
    cr_assert(r->answer == NULL || r->n_votes > 0);
    er_session_free(s);
    er_model_free(m);

    // Heads for another model are refused by the API.
    char other[512];
    snprintf(other, sizeof other, "%s/other", tmp);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", model_dir, other);
    cr_assert_eq(system(cmd), 0);
    Model om;
    cr_assert_eq(model_load(&om, other, MODEL_LOAD_TRAINABLE), 0);
    model_find_param(&om, "model.embed_tokens.weight")->data[0] += 1.0f; // one value: another model
    cr_assert_eq(model_save(&om, other, 0), 0);
    model_free(&om);
    cr_assert_eq(er_model_load(&m, other), 0);
    cr_assert_lt(er_model_load_verifier(m, vfp), 0);
    cr_assert(strstr(er_last_error(), "another model"), "%s", er_last_error());
    er_model_free(m);
    helper_rmdir(tmp);
    er_free(tmp);
}
