#include "verifier_train/verifier.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "data/grade.h"
#include "model/head.h"
#include "train/dist.h"

int verifier_collect(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, const int *vq, int nvq,
                     int adapter_on, const char *gold, float *feats, float *labels, long *tokens) {
    if (!gold)
        return er_error(ER_EINVAL, "verifier labels: the record has no gold answer");
    GenConfig k = *g;
    k.keep_kv = 1;
    int N = k.n_samples;
    GenSample *s = er_calloc((size_t)N, sizeof(GenSample));
    if (!s)
        return ER_ENOMEM;
    GenStats st;
    int rc = ER_OK;
    ER_CHECK(engine_generate(e, prompt, n_prompt, &k, NULL, NULL, s, &st));
    for (int i = 0; i < N; i++) {
        int ok = grade_response(s[i].text, s[i].answer_at, grade_think_opens(k.response_prefix), gold, NULL);
        ER_CHECK(ok);
        labels[i] = (float)ok;
        if (tokens)
            *tokens += s[i].n_tokens;
    }
    ER_CHECK(engine_verify_features_all(e, vq, nvq, adapter_on, feats));
done:
    engine_release_samples(e);
    gen_samples_free(s, N);
    er_free(s);
    return rc;
}

void verifier_config_default(VerifierConfig *c) {
    memset(c, 0, sizeof *c);
    c->verify_prompt = HEAD_DEFAULT_VERIFY_PROMPT;
    c->samples = 16;
    c->temperature = 0.8;
    head_fit_config_default(&c->fit);
}

// A verifier being trained: its rows and the tokens of its verification prompt.
typedef struct {
    const VerifierConfig *c;
    HeadRows tr, cal, rep; // rows by split (HEADS_TRAIN, HEADS_CALIBRATE, HEADS_REPORT)
    int *vq, n_vq;
    float *labels; // (samples): one record's
    double right;  // sampled responses graded correct
} Verifier;

static void verifier_free(void *self) {
    Verifier *v = self;
    head_rows_free(&v->tr);
    head_rows_free(&v->cal);
    head_rows_free(&v->rep);
    er_free(v->vq);
    er_free(v->labels);
    er_free(v);
}

// The verification prompt's tokens (appended after each response) and room for one record's labels.
static int prepare(void *self, HeadsData *d) {
    Verifier *v = self;
    const char *p = v->c->verify_prompt;
    v->tr.C = v->cal.C = v->rep.C = d->m.cfg.C;
    ER_TRY(tok_encode(d->tok, p, strlen(p), &v->vq, &v->n_vq));
    if (v->n_vq < 1)
        return er_error(ER_EINVAL, "--verify-prompt encodes to no tokens");
    if (!(v->labels = er_alloc(sizeof(float) * (size_t)v->c->samples)))
        return ER_ENOMEM;
    return v->n_vq;
}

// Record i: samples from the adapter, each graded and read after the verification prompt.
static int collect(void *self, HeadsData *d, int i) {
    Verifier *v = self;
    HeadRows *r = d->split[i] == HEADS_TRAIN ? &v->tr : d->split[i] == HEADS_CALIBRATE ? &v->cal : &v->rep;
    GenConfig g = d->reasoning;
    g.n_samples = v->c->samples;
    g.sampler.temperature = (float)v->c->temperature;
    g.seed = (uint64_t)d->c->seed * 1000003u + (uint64_t)i; // every prompt its own streams
    ER_TRY(head_rows_reserve(r, v->c->samples));
    ER_TRY(verifier_collect(&d->e, d->ids[i], d->nids[i], &g, v->vq, v->n_vq, v->c->adapter_on, d->d.ex[i].answer,
                            r->x + (size_t)r->n * r->C, v->labels, &d->gen_tokens));
    for (int k = 0; k < v->c->samples; k++) {
        r->y[r->n++] = v->labels[k];
        v->right += v->labels[k];
    }
    return ER_OK;
}

// Every rank's rows and graded count (heads_run under mpirun).
static int gather(void *self, HeadsData *d) {
    Verifier *v = self;
    ER_TRY(head_rows_gather(&v->tr));
    ER_TRY(head_rows_gather(&v->cal));
    ER_TRY(head_rows_gather(&v->rep));
    return dist_sum_doubles(&v->right, 1);
}

static void report(void *self, const HeadsData *d, FILE *out) {
    const Verifier *v = self;
    int n = d->d.n * v->c->samples;
    if (out)
        fprintf(out, "verifier labels: %.0f/%d sampled responses correct (%.1f%%)\n", v->right, n,
                100.0 * v->right / n);
}

// The linear head, fitted, calibrated for the best accuracy and saved.
static int train(void *self, const HeadsData *d, MetricsLog *ml, cJSON *results) {
    Verifier *v = self;
    const VerifierConfig *c = v->c;
    int rc = ER_OK;
    TrainedHead t = {0};
    t.role = HEAD_VERIFIER;
    t.adapter_on = c->adapter_on;
    t.kv = d->c->kv == KV_INT8 ? HEAD_KV_INT8 : HEAD_KV_F32;
    model_fingerprint(&d->m, t.fingerprint);
    HeadTrainSpec spec = {.fit = c->fit, .positive = "correct", .allow_one_class = d->c->allow_one_class,
                          .out = d->c->out, .log = d->c->log};
    spec.fit.seed = (uint64_t)d->c->seed + 2;
    spec.fit.label = "verifier";
    spec.fit.metrics = ml;
    ER_CHECK(head_init(&t.net, HEAD_LINEAR, v->tr.C, 1, 0, 1, (uint64_t)d->c->seed + 202));
    if (!(t.verify_prompt = er_strdup(c->verify_prompt)))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(head_train(&t, &v->tr, &v->cal, &v->rep, &spec, results));
    ER_CHECK(head_save(&t, "verifier", c->out, d->c->out));
done:
    trained_head_free(&t);
    return rc;
}

int verifier_job(const VerifierConfig *c, HeadJob *job) {
    Verifier *v = er_calloc(1, sizeof *v);
    if (!v)
        return ER_ENOMEM;
    v->c = c;
    // The samples of one record decode together; every record needs its gold answer to grade them.
    *job = (HeadJob){.what = "verifier", .need_gold = 1, .n_seqs = c->samples, .self = v, .prepare = prepare,
                     .collect = collect, .gather = gather, .report = report, .train = train, .free = verifier_free};
    return ER_OK;
}
