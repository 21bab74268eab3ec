#include "switcher_train/switcher.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/grade.h"
#include "model/head.h"
#include "train/dist.h"

int switcher_features(Engine *e, const int *prompt, int n_prompt, const LoraAdapter *adapter,
                      const PromptFeatureSpec *spec, float *feat) {
    return engine_prefill(e, prompt, n_prompt, adapter, spec, feat, NULL);
}

// One sample of g's route, graded.
static int route_correct(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, const char *gold, int *ok,
                         long *tokens) {
    GenConfig one = *g;
    one.n_samples = 1;
    one.sampler.temperature = 0;
    one.keep_kv = 0;
    GenSample s;
    GenStats st;
    ER_TRY(engine_generate(e, prompt, n_prompt, &one, NULL, NULL, &s, &st));
    int rc = grade_response(s.text, s.answer_at, grade_think_opens(one.response_prefix), gold, NULL);
    if (tokens)
        *tokens += s.n_tokens;
    gen_samples_free(&s, 1);
    ER_TRY(rc);
    *ok = rc;
    return ER_OK;
}

int switcher_derive_label(Engine *e, const int *prompt, int n_prompt, const GenConfig *direct,
                          const GenConfig *reasoning, int hybrid, const char *gold, int *label, int *base_ok,
                          int *adapter_ok, long *tokens) {
    if (!gold)
        return er_error(ER_EINVAL, "switcher labels: the record has no gold answer");
    if (!reasoning->adapter && !hybrid)
        return er_error(ER_EINVAL, "switcher labels: deriving them needs the reasoning adapter (or a hybrid-thinking "
                        "model)");
    GenConfig d = *direct;
    d.adapter = NULL;
    d.response_prefix = hybrid ? CHAT_THINK_OFF : NULL;
    int b, a;
    ER_TRY(route_correct(e, prompt, n_prompt, &d, gold, &b, tokens));
    ER_TRY(route_correct(e, prompt, n_prompt, reasoning, gold, &a, tokens));
    *label = !b && a;
    if (base_ok)
        *base_ok = b;
    if (adapter_ok)
        *adapter_ok = a;
    return ER_OK;
}

void switcher_config_default(SwitcherConfig *c) {
    memset(c, 0, sizeof *c);
    c->chunk = HEAD_DEFAULT_CHUNK;
    c->alpha = HEAD_DEFAULT_ALPHA;
    c->hidden = 8;
    c->dropout = 0.2;
    c->direct_max_new = 64;
    head_fit_config_default(&c->fit);
    c->fit.noise = 0.5f;
}

// A switcher being trained: its rows and label counts.
typedef struct {
    const SwitcherConfig *c;
    HeadRows tr, cal, rep; // rows by split (HEADS_TRAIN, HEADS_CALIBRATE, HEADS_REPORT)
    GenConfig direct;
    PromptFeatureSpec spec;
    int base_right, adapter_right, positive;
} Switcher;

static void switcher_free(void *self) {
    Switcher *s = self;
    head_rows_free(&s->tr);
    head_rows_free(&s->cal);
    head_rows_free(&s->rep);
    er_free(s);
}

static int check_record(void *self, const HeadsData *d, const Example *ex) {
    const Switcher *s = self;
    if (!s->c->derive_labels && ex->needs_reasoning < 0)
        return er_error(ER_EFORMAT, "%s:%ld: record has no \"needs_reasoning\": add it or pass --derive-labels to "
                        "derive the switcher's labels by running both routes", d->c->data_path, ex->line);
    return ER_OK;
}

static int prepare(void *self, HeadsData *d) {
    Switcher *s = self;
    s->tr.C = s->cal.C = s->rep.C = d->m.cfg.C;
    gen_config_default(&s->direct);
    s->direct.max_new = s->c->direct_max_new;
    s->spec = (PromptFeatureSpec){s->c->chunk, (float)s->c->alpha};
    return 0; // nothing appended after a response
}

// Record i: its features and its label (the record's, or derived by running both routes).
static int collect(void *self, HeadsData *d, int i) {
    Switcher *s = self;
    const Example *ex = &d->d.ex[i];
    HeadRows *r = d->split[i] == HEADS_TRAIN ? &s->tr : d->split[i] == HEADS_CALIBRATE ? &s->cal : &s->rep;
    ER_TRY(head_rows_reserve(r, 1));
    ER_TRY(switcher_features(&d->e, d->ids[i], d->nids[i], d->reasoning.adapter, &s->spec,
                             r->x + (size_t)r->n * r->C));
    int label = ex->needs_reasoning, b = 0, a = 0;
    if (s->c->derive_labels)
        ER_TRY(switcher_derive_label(&d->e, d->ids[i], d->nids[i], &s->direct, &d->reasoning, d->hybrid, ex->answer,
                                     &label, &b, &a, &d->gen_tokens));
    r->y[r->n++] = (float)label;
    s->base_right += b;
    s->adapter_right += a;
    s->positive += label;
    return ER_OK;
}

// Every rank's rows and label counts (heads_run under mpirun).
static int gather(void *self, HeadsData *d) {
    Switcher *s = self;
    ER_TRY(head_rows_gather(&s->tr));
    ER_TRY(head_rows_gather(&s->cal));
    ER_TRY(head_rows_gather(&s->rep));
    double n[3] = {s->base_right, s->adapter_right, s->positive};
    ER_TRY(dist_sum_doubles(n, 3));
    s->base_right = (int)n[0], s->adapter_right = (int)n[1], s->positive = (int)n[2];
    return ER_OK;
}

static void report(void *self, const HeadsData *d, FILE *out) {
    const Switcher *s = self;
    if (out && s->c->derive_labels)
        fprintf(out, "switcher labels: base direct right %d/%d, adapter right %d/%d, reasoning needed %d/%d\n",
                s->base_right, d->d.n, s->adapter_right, d->d.n, s->positive, d->d.n);
}

// The MLP, fitted, calibrated and saved; a threshold of 1 (no prompt ever reasons) is refused.
static int train(void *self, const HeadsData *d, MetricsLog *ml, cJSON *results) {
    Switcher *s = self;
    const SwitcherConfig *c = s->c;
    int rc = ER_OK;
    TrainedHead t = {0};
    t.role = HEAD_SWITCHER;
    t.chunk = c->chunk;
    t.alpha = (float)c->alpha;
    t.kv = d->c->kv == KV_INT8 ? HEAD_KV_INT8 : HEAD_KV_F32;
    model_fingerprint(&d->m, t.fingerprint);
    HeadTrainSpec spec = {.fit = c->fit, .target_recall = c->target_recall, .positive = "needs reasoning",
                          .allow_one_class = d->c->allow_one_class, .out = d->c->out, .log = d->c->log};
    spec.fit.seed = (uint64_t)d->c->seed + 1;
    spec.fit.label = "switcher";
    spec.fit.metrics = ml;
    ER_CHECK(head_init(&t.net, HEAD_MLP, s->tr.C, c->hidden, (float)c->dropout, 1, (uint64_t)d->c->seed + 101));
    ER_CHECK(head_train(&t, &s->tr, &s->cal, &s->rep, &spec, results));
    if (t.threshold < 1.0f)
        ER_CHECK(head_save(&t, "switcher", c->out, d->c->out));
    else
        rc = er_error(ER_EINVAL, "switcher: the best-accuracy threshold on the calibration records is 1, which sends "
                      "no prompt to reasoning; pass --target-recall R (e.g. 0.9) or give more records that need "
                      "reasoning");
done:
    trained_head_free(&t);
    return rc;
}

int switcher_job(const SwitcherConfig *c, HeadJob *job) {
    Switcher *s = er_calloc(1, sizeof *s);
    if (!s)
        return ER_ENOMEM;
    s->c = c;
    // Derived labels grade the base's direct answer too: gold answers, and room for that answer.
    *job = (HeadJob){.what = c->derive_labels ? "switcher (derived labels)" : "switcher",
                     .need_gold = c->derive_labels, .n_seqs = 1, .max_new = c->derive_labels ? c->direct_max_new : 0,
                     .self = s, .check = check_record, .prepare = prepare, .collect = collect, .gather = gather,
                     .report = report,
                     .train = train, .free = switcher_free};
    return ER_OK;
}
