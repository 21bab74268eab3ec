#include "infer/pipeline.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/progress.h"
#include "data/chat.h"
#include "data/grade.h"

void votes_free(Vote *v, int n) {
    for (int i = 0; v && i < n; i++)
        er_free(v[i].answer);
    er_free(v);
}

int pipeline_vote(char *const *answers, const float *weights, const float *tiebreak, int n, Vote **votes,
                  int *n_votes, int *winner) {
    *votes = NULL;
    *n_votes = 0;
    *winner = -1;
    Vote *v = er_calloc((size_t)(n > 0 ? n : 1), sizeof(Vote));
    if (!v)
        return ER_ENOMEM;
    int nv = 0, rc = ER_OK;
    for (int i = 0; i < n; i++) {
        if (!answers[i])
            continue;
        int g = -1;
        for (int k = 0; g < 0 && k < nv; k++) {
            int eq = grade_equal(answers[i], v[k].answer);
            ER_CHECK(eq);
            if (eq)
                g = k;
        }
        float tb = tiebreak ? tiebreak[i] : 0.0f;
        if (g < 0) {
            g = nv++;
            v[g].answer = er_strdup(answers[i]);
            if (!v[g].answer) {
                rc = ER_ENOMEM;
                goto done;
            }
            v[g].first = i;
            v[g].best = tb;
        }
        v[g].weight += weights ? weights[i] : 1.0;
        v[g].count++;
        if (tb > v[g].best)
            v[g].best = tb;
    }
    int w = -1;
    for (int k = 0; k < nv; k++) // groups are in order of first voter: strict > keeps the earliest
        if (w < 0 || v[k].weight > v[w].weight || (v[k].weight == v[w].weight && v[k].best > v[w].best))
            w = k;
    *votes = v;
    *n_votes = nv;
    *winner = w;
done:
    if (rc < 0)
        votes_free(v, nv);
    return rc;
}

void pipeline_result_free(PipelineResult *r) {
    for (int i = 0; r->answers && i < r->n; i++)
        er_free(r->answers[i]);
    er_free(r->answers);
    er_free(r->verifier_scores);
    er_free(r->verify_tokens);
    er_free(r->response_prefix);
    votes_free(r->votes, r->n_votes);
    memset(r, 0, sizeof *r);
}

int pipeline_can_reason(const PipelineConfig *c) { return c->reasoning.adapter || c->hybrid; }

// The generation a route runs: the reasoning samples as configured, or the base's direct answer
// (greedy, one sample, no adapter, no prefix; a hybrid base's thinking off: its empty think block).
// The verifier reads the reasoning samples' KV.
static GenConfig route_generation(const PipelineConfig *c, int route) {
    GenConfig g = route == ROUTE_REASONING ? c->reasoning : c->direct;
    if (route == ROUTE_DIRECT) {
        g.n_samples = 1;
        g.sampler.temperature = 0;
        g.adapter = NULL;
        g.response_prefix = c->hybrid ? CHAT_THINK_OFF : NULL;
    }
    g.keep_kv = route == ROUTE_REASONING && c->verifier;
    return g;
}

// 1. The prompt, once, with the base (a masked adapter is off there); the switcher reads its features
// and picks the route; *g is the generation that route runs. Both routes' generations are checked
// first, the verifier's prompt included, so a query that cannot run fails before any work.
int pipeline_begin(Engine *e, const int *prompt, int n_prompt, const PipelineConfig *c, PipelineResult *r,
                   GenConfig *g) {
    double t0 = time_now();
    long fp0 = e->forward_positions;
    memset(r, 0, sizeof *r);
    r->switcher_score = -1;
    r->winner = -1;
    const LoraAdapter *ad = c->reasoning.adapter;
    int reason = pipeline_can_reason(c);
    float *feat = NULL;
    int rc = ER_OK;
    if (c->verifier && reason) {
        if (!e->tok)
            ER_CHECK(er_error(ER_EINVAL, "pipeline: the verifier's prompt needs a tokenizer"));
        const char *vp = c->verifier->verify_prompt;
        ER_CHECK(tok_encode(e->tok, vp, strlen(vp), &r->verify_tokens, &r->n_verify));
        if (r->n_verify < 1)
            ER_CHECK(er_error(ER_EINVAL, "pipeline: the verification prompt encodes to no tokens"));
    }
    GenConfig reasoning = route_generation(c, ROUTE_REASONING), direct = route_generation(c, ROUTE_DIRECT);
    if (reason)
        ER_CHECK(engine_check_generation(e, &reasoning, n_prompt, r->n_verify));
    ER_CHECK(engine_check_generation(e, &direct, n_prompt, 0));
    feat = er_alloc(sizeof(float) * (size_t)e->model->cfg.C);
    if (!feat)
        ER_CHECK(ER_ENOMEM);
    PromptFeatureSpec spec = {c->switcher ? c->switcher->chunk : 0, c->switcher ? c->switcher->alpha : 0};
    GenStats st;
    ER_CHECK(engine_prefill(e, prompt, n_prompt, ad, c->switcher ? &spec : NULL, feat, &st));
    r->prompt_reused = st.prompt_reused;
    double t1 = time_now();
    r->prefill_s = t1 - t0;
    if (c->switcher)
        ER_CHECK(head_predict(&c->switcher->net, feat, 1, &r->switcher_score));
    r->route = reason && (!c->switcher || r->switcher_score >= c->switcher->threshold) ? ROUTE_REASONING
                                                                                       : ROUTE_DIRECT;
    if (c->force_route != PIPELINE_AUTO)
        r->route = c->force_route == PIPELINE_REASONING && reason ? ROUTE_REASONING : ROUTE_DIRECT;
    r->switcher_s = time_now() - t1;
    // 2. The answer(s) the caller generates: the prompt's cache is reused whole by either route.
    *g = r->route == ROUTE_REASONING ? reasoning : direct;
    if (g->response_prefix && !(r->response_prefix = er_strdup(g->response_prefix)))
        ER_CHECK(ER_ENOMEM);
    r->n = g->n_samples;
    r->t_generate = time_now();
    r->forward_positions = e->forward_positions - fp0;
done:
    er_free(feat);
    if (rc < 0)
        pipeline_result_free(r);
    return rc;
}

// 3. Verifier scores from each sample's KV cache (kept by the generation), then the vote.
int pipeline_end(Engine *e, const PipelineConfig *c, const GenSample *out, PipelineResult *r) {
    double t3 = time_now();
    long fp0 = e->forward_positions;
    r->generate_s = t3 - r->t_generate;
    int C = e->model->cfg.C, rc = ER_OK, verify = r->route == ROUTE_REASONING && c->verifier;
    float *feats = NULL;
    r->answers = er_calloc((size_t)r->n, sizeof(char *));
    if (!r->answers)
        ER_CHECK(ER_ENOMEM);
    // A sample that never closed the think block its prefix opened gives no answer (no vote).
    int think_open = grade_think_opens(route_generation(c, r->route).response_prefix);
    for (int i = 0; i < r->n; i++)
        ER_CHECK(grade_answer(out[i].text, out[i].answer_at, think_open, &r->answers[i]));
    if (verify) {
        r->verifier_scores = er_alloc(sizeof(float) * (size_t)r->n);
        feats = er_alloc(sizeof(float) * (size_t)r->n * C);
        if (!r->verifier_scores || !feats)
            ER_CHECK(ER_ENOMEM);
        ER_CHECK(engine_verify_features_all(e, r->verify_tokens, r->n_verify, c->verifier->adapter_on, feats));
        ER_CHECK(head_predict(&c->verifier->net, feats, r->n, r->verifier_scores));
    }
    engine_release_samples(e);
    r->verify_s = time_now() - t3;
    ER_CHECK(pipeline_vote(r->answers, r->verifier_scores, r->verifier_scores, r->n, &r->votes, &r->n_votes,
                           &r->winner));
    r->total_s = r->prefill_s + r->switcher_s + r->generate_s + r->verify_s;
    r->forward_positions += r->gen.forward_positions + e->forward_positions - fp0;
done:
    er_free(feats);
    if (rc < 0) {
        engine_release_samples(e); // the kept samples of a failed verification
        pipeline_result_free(r);
    }
    return rc;
}

int pipeline_run(Engine *e, const int *prompt, int n_prompt, const PipelineConfig *c, GenTokenFn cb, void *user,
                 GenSample *out, PipelineResult *r) {
    GenConfig g;
    ER_TRY(pipeline_begin(e, prompt, n_prompt, c, r, &g));
    int rc = engine_generate(e, prompt, n_prompt, &g, cb, user, out, &r->gen);
    if (rc < 0) {
        pipeline_result_free(r);
        return rc;
    }
    rc = pipeline_end(e, c, out, r);
    if (rc < 0)
        gen_samples_free(out, g.n_samples);
    return rc;
}
