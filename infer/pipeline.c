#include "infer/pipeline.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/progress.h"
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
    votes_free(r->votes, r->n_votes);
    memset(r, 0, sizeof *r);
}

int pipeline_run(Engine *e, const int *prompt, int n_prompt, const PipelineConfig *c, GenTokenFn cb, void *user,
                 GenSample *out, PipelineResult *r) {
    double t0 = time_now();
    long fp0 = e->forward_positions;
    memset(r, 0, sizeof *r);
    r->switcher_score = -1;
    r->winner = -1;
    const LoraAdapter *ad = c->reasoning.adapter;
    int C = e->model->cfg.C, rc = ER_OK;
    int *vq = NULL, nvq = 0;
    float *feat = NULL, *feats = NULL;
    if (c->verifier && ad) {
        if (!e->tok)
            return er_error(ER_EINVAL, "pipeline: the verifier's prompt needs a tokenizer");
        ER_TRY(tok_encode(e->tok, c->verifier->verify_prompt, strlen(c->verifier->verify_prompt), &vq, &nvq));
        if (nvq < 1) {
            rc = er_error(ER_EINVAL, "pipeline: the verification prompt encodes to no tokens");
            goto done;
        }
    }
    feat = er_alloc(sizeof(float) * (size_t)C);
    if (!feat) {
        rc = ER_ENOMEM;
        goto done;
    }

    // 1. The prompt, once, with the base (a masked adapter is off there); the switcher reads its features.
    PromptFeatureSpec spec = {c->switcher ? c->switcher->chunk : 0, c->switcher ? c->switcher->alpha : 0};
    ER_CHECK(engine_prefill(e, prompt, n_prompt, ad, c->switcher ? &spec : NULL, feat, NULL));
    double t1 = time_now();
    r->prefill_s = t1 - t0;
    if (c->switcher)
        ER_CHECK(head_predict(&c->switcher->net, feat, 1, &r->switcher_score));
    r->route = ad && (!c->switcher || r->switcher_score >= c->switcher->threshold) ? ROUTE_REASONING : ROUTE_DIRECT;
    if (c->force_route != PIPELINE_AUTO)
        r->route = c->force_route == PIPELINE_REASONING && ad ? ROUTE_REASONING : ROUTE_DIRECT;
    double t2 = time_now();
    r->switcher_s = t2 - t1;

    // 2. The answer(s): the prompt's cache is reused whole by either route.
    GenConfig g = r->route == ROUTE_REASONING ? c->reasoning : c->direct;
    if (r->route == ROUTE_DIRECT) {
        g.n_samples = 1;
        g.sampler.temperature = 0;
        g.adapter = NULL;
        g.response_prefix = NULL;
    }
    g.keep_kv = r->route == ROUTE_REASONING && vq != NULL;
    ER_CHECK(engine_generate(e, prompt, n_prompt, &g, cb, user, out, &r->gen));
    r->n = g.n_samples;
    double t3 = time_now();
    r->generate_s = t3 - t2;

    // 3. Verifier scores from each sample's KV cache, then the vote.
    r->answers = er_calloc((size_t)r->n, sizeof(char *));
    if (!r->answers) {
        rc = ER_ENOMEM;
        goto done;
    }
    for (int i = 0; i < r->n; i++)
        ER_CHECK(grade_answer(out[i].text, out[i].answer_at, &r->answers[i]));
    if (g.keep_kv) {
        r->verifier_scores = er_alloc(sizeof(float) * (size_t)r->n);
        feats = er_alloc(sizeof(float) * (size_t)r->n * C);
        if (!r->verifier_scores || !feats) {
            rc = ER_ENOMEM;
            goto done;
        }
        ER_CHECK(engine_verify_features_all(e, vq, nvq, c->verifier->adapter_on, feats));
        ER_CHECK(head_predict(&c->verifier->net, feats, r->n, r->verifier_scores));
    }
    engine_release_samples(e);
    r->verify_s = time_now() - t3;
    ER_CHECK(pipeline_vote(r->answers, r->verifier_scores, r->verifier_scores, r->n, &r->votes, &r->n_votes,
                           &r->winner));
    r->total_s = time_now() - t0;
    r->forward_positions = e->forward_positions - fp0;
done:
    er_free(feats);
    er_free(feat);
    er_free(vq);
    if (rc < 0) {
        engine_release_samples(e); // the kept samples of a failed verification
        if (r->n > 0)
            gen_samples_free(out, r->n);
        pipeline_result_free(r);
    }
    return rc;
}
