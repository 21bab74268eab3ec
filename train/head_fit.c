#include "train/head_fit.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "train/dist.h"
#include "train/optim.h"

void head_fit_config_default(HeadFitConfig *c) {
    memset(c, 0, sizeof *c);
    c->epochs = 100;
    c->batch = 32;
    c->lr = 1e-3;
    c->weight_decay = 0.01;
    c->noise = 0;
    c->label = "head";
}

// Mean BCE of the head over rows x (n, in) without noise or dropout.
static int eval_loss(const Head *h, const float *x, const float *y, int n, double *loss) {
    float *logit = er_alloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!logit)
        return ER_ENOMEM;
    int rc = head_forward(h, x, n, logit, NULL, NULL);
    *loss = rc < 0 ? NAN : head_bce(logit, y, n, NULL);
    er_free(logit);
    return rc;
}

// w1' = w1 / sd, b1' = b1 - w1' . mean: the head then reads raw features.
static void fold_standardisation(Head *h, const float *mean, const float *sd) {
    for (int j = 0; j < h->hidden; j++) {
        float *w = h->w1 + (size_t)j * h->in;
        double shift = 0;
        for (int i = 0; i < h->in; i++) {
            w[i] /= sd[i];
            shift += (double)w[i] * mean[i];
        }
        h->b1[j] -= (float)shift;
    }
}

// mean, sd (C) of the training rows x (n, C); xs = the rows standardised with them.
static void standardise(const float *x, int n, int C, float *mean, float *sd, float *xs) {
    for (int i = 0; i < C; i++) {
        double s = 0, s2 = 0;
        for (int r = 0; r < n; r++)
            s += x[(size_t)r * C + i];
        double m = s / n;
        for (int r = 0; r < n; r++) {
            double d = x[(size_t)r * C + i] - m;
            s2 += d * d;
        }
        mean[i] = (float)m;
        sd[i] = (float)sqrt(s2 / n);
        if (!(sd[i] > 1e-6f)) // a constant feature: leave its scale alone
            sd[i] = 1.0f;
    }
    for (int r = 0; r < n; r++)
        for (int i = 0; i < C; i++)
            xs[(size_t)r * C + i] = (x[(size_t)r * C + i] - mean[i]) / sd[i];
}

static int check_rows(const float *x, int n, int C, const char *label, const char *which) {
    for (size_t i = 0; i < (size_t)n * C; i++)
        if (!isfinite(x[i]))
            return er_error(ER_ERANGE, "%s: %s row %zu, feature %zu is not finite", label, which, i / C, i % C);
    return ER_OK;
}

// The buffers of one fit: standardised rows, a batch, the optimizer.
typedef struct {
    float *mean, *sd, *xs, *xvs; // (C), (C), (n, C), (n_val, C)
    float *xb, *yb, *logit, *dlogit; // (B, C), (B), (B), (B)
    int *order;                  // (n)
    unsigned char *decay;        // (n_params): weight decay on weights, not on biases
    HeadActs acts;
    AdamW opt;
} FitState;

static void fit_state_free(FitState *f) {
    adamw_free(&f->opt);
    head_acts_free(&f->acts);
    er_free(f->decay);
    er_free(f->mean);
    er_free(f->sd);
    er_free(f->xs);
    er_free(f->xvs);
    er_free(f->xb);
    er_free(f->yb);
    er_free(f->logit);
    er_free(f->dlogit);
    er_free(f->order);
    memset(f, 0, sizeof *f);
}

static int fit_state_init(FitState *f, const Head *h, int n, int n_val, int B, const HeadFitConfig *c) {
    memset(f, 0, sizeof *f);
    int C = h->in;
    f->mean = er_calloc((size_t)C, sizeof(float));
    f->sd = er_calloc((size_t)C, sizeof(float));
    f->xs = er_alloc(sizeof(float) * (size_t)n * C);
    f->xvs = er_alloc(sizeof(float) * (size_t)(n_val > 0 ? n_val : 1) * C);
    f->xb = er_alloc(sizeof(float) * (size_t)B * C);
    f->yb = er_alloc(sizeof(float) * (size_t)B);
    f->logit = er_alloc(sizeof(float) * (size_t)B);
    f->dlogit = er_alloc(sizeof(float) * (size_t)B);
    f->order = er_alloc(sizeof(int) * (size_t)n);
    f->decay = er_calloc(h->n_params, 1);
    if (!f->mean || !f->sd || !f->xs || !f->xvs || !f->xb || !f->yb || !f->logit || !f->dlogit || !f->order ||
        !f->decay)
        return ER_ENOMEM;
    memset(f->decay, 1, (size_t)h->hidden * C);
    if (h->w2)
        memset(f->decay + (h->w2 - h->params), 1, (size_t)h->hidden);
    ER_TRY(head_acts_alloc(&f->acts, h, B));
    return adamw_init(&f->opt, backend_cpu(), h->n_params, c->lr, 0.9, 0.999, 1e-8, c->weight_decay);
}

// One pass over the training rows in a fresh order; *loss = their mean BCE.
static int fit_epoch(Head *h, FitState *f, const float *y, int n, int B, const HeadFitConfig *c, ErRng *rng,
                     double *loss) {
    int C = h->in;
    shuffle_indices(f->order, n, rng);
    double sum = 0;
    for (int s = 0; s < n; s += B) {
        int nb = n - s < B ? n - s : B;
        for (int k = 0; k < nb; k++) {
            const float *src = f->xs + (size_t)f->order[s + k] * C;
            float *dst = f->xb + (size_t)k * C;
            for (int i = 0; i < C; i++)
                dst[i] = src[i] + (c->noise > 0 ? c->noise * rng_normal(rng) : 0.0f);
            f->yb[k] = y[f->order[s + k]];
        }
        head_zero_grad(h);
        ER_TRY(head_forward(h, f->xb, nb, f->logit, &f->acts, rng));
        sum += head_bce(f->logit, f->yb, nb, f->dlogit) * nb;
        ER_TRY(head_backward(h, f->xb, f->dlogit, nb, &f->acts));
        ER_TRY(adamw_step(&f->opt, h->params, h->grads, f->decay, c->lr));
    }
    *loss = sum / n;
    return ER_OK;
}

static int write_metrics_line(MetricsLog *ml, const char *label, int step, double loss, double vloss) {
    cJSON *line = cJSON_CreateObject();
    if (!line)
        return ER_ENOMEM;
    cJSON_AddStringToObject(line, "head", label);
    cJSON_AddNumberToObject(line, "step", step);
    cJSON_AddNumberToObject(line, "loss", loss);
    if (isfinite(vloss))
        cJSON_AddNumberToObject(line, "val_loss", vloss);
    int rc = metrics_write(ml, line);
    cJSON_Delete(line);
    return rc;
}

int head_fit(Head *h, const float *x, const float *y, int n, const float *xv, const float *yv, int n_val,
             const HeadFitConfig *c, HeadFitResult *res) {
    res->first_loss = res->last_loss = res->val_loss = NAN;
    if (n < 1)
        return er_error(ER_EINVAL, "%s: no training rows", c->label);
    if (!h->grads)
        return er_error(ER_EINVAL, "%s: the head has no gradients", c->label);
    if (c->epochs < 1 || c->batch < 1 || !(c->lr > 0) || c->noise < 0)
        return er_error(ER_EINVAL, "%s: need epochs >= 1, batch >= 1, lr > 0 and noise >= 0", c->label);
    int C = h->in, B = c->batch < n ? c->batch : n;
    ER_TRY(check_rows(x, n, C, c->label, "training"));
    ER_TRY(check_rows(xv, n_val, C, c->label, "held-out"));
    int rc = ER_OK;
    FitState f;
    ER_CHECK(fit_state_init(&f, h, n, n_val, B, c));
    standardise(x, n, C, f.mean, f.sd, f.xs);
    for (int r = 0; r < n_val; r++)
        for (int i = 0; i < C; i++)
            f.xvs[(size_t)r * C + i] = (xv[(size_t)r * C + i] - f.mean[i]) / f.sd[i];
    for (int i = 0; i < n; i++)
        f.order[i] = i;
    ErRng rng;
    rng_seed(&rng, c->seed);
    for (int ep = 0; ep < c->epochs; ep++) {
        double loss, vloss = NAN;
        ER_CHECK(fit_epoch(h, &f, y, n, B, c, &rng, &loss));
        if (!isfinite(loss)) {
            rc = er_error(ER_ERANGE, "%s: the training loss is not finite at epoch %d", c->label, ep + 1);
            goto done;
        }
        if (ep == 0)
            res->first_loss = loss;
        res->last_loss = loss;
        if (n_val > 0)
            ER_CHECK(eval_loss(h, f.xvs, yv, n_val, &vloss));
        res->val_loss = vloss;
        if (c->metrics)
            ER_CHECK(write_metrics_line(c->metrics, c->label, ep + 1, loss, vloss));
    }
    fold_standardisation(h, f.mean, f.sd);
done:
    fit_state_free(&f);
    return rc;
}

typedef struct {
    float s;
    float y;
} ScoreLabel;

static int by_score(const void *a, const void *b) {
    float x = ((const ScoreLabel *)a)->s, z = ((const ScoreLabel *)b)->s;
    return (x > z) - (x < z);
}

double roc_auc(const float *score, const float *y, int n) {
    ScoreLabel *v = er_alloc(sizeof(ScoreLabel) * (size_t)(n > 0 ? n : 1));
    if (!v)
        return NAN;
    long pos = 0;
    for (int i = 0; i < n; i++) {
        v[i] = (ScoreLabel){score[i], y[i]};
        pos += y[i] > 0.5f;
    }
    long neg = n - pos;
    if (pos == 0 || neg == 0) {
        er_free(v);
        return NAN;
    }
    qsort(v, (size_t)n, sizeof *v, by_score);
    // Mann-Whitney: sum of the positives' ranks (ties get the mean rank).
    double rank_sum = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && v[j].s == v[i].s)
            j++;
        double rank = (i + 1 + j) / 2.0; // ranks i+1 .. j
        for (int k = i; k < j; k++)
            if (v[k].y > 0.5f)
                rank_sum += rank;
        i = j;
    }
    er_free(v);
    return (rank_sum - (double)pos * (pos + 1) / 2) / ((double)pos * neg);
}

double accuracy_at(const float *score, const float *y, int n, float t) {
    if (n < 1)
        return NAN;
    int ok = 0;
    for (int i = 0; i < n; i++)
        ok += (score[i] >= t) == (y[i] > 0.5f);
    return (double)ok / n;
}

float threshold_choose(const float *score, const float *y, int n, double target_recall) {
    if (n < 1)
        return 0.5f;
    if (target_recall > 0) {
        int pos = 0;
        for (int i = 0; i < n; i++)
            pos += y[i] > 0.5f;
        if (pos == 0)
            return 0.5f;
        // Ascending: the need-th highest positive score keeps `need` positives at or above it.
        ScoreLabel *v = er_alloc(sizeof(ScoreLabel) * (size_t)pos);
        if (!v)
            return 0.5f;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (y[i] > 0.5f)
                v[k++] = (ScoreLabel){score[i], 1};
        qsort(v, (size_t)pos, sizeof *v, by_score);
        int need = (int)ceil(target_recall * pos - 1e-9);
        if (need < 1)
            need = 1;
        if (need > pos)
            need = pos;
        float t = v[pos - need].s;
        er_free(v);
        return t;
    }
    // Best accuracy over the candidate thresholds: every score, and 1 (all negative).
    float best_t = 1.0f;
    double best = accuracy_at(score, y, n, 1.0f);
    for (int i = 0; i < n; i++) {
        double a = accuracy_at(score, y, n, score[i]);
        if (a > best || (a == best && score[i] < best_t)) {
            best = a;
            best_t = score[i];
        }
    }
    return best_t;
}

int head_rows_reserve(HeadRows *r, int more) {
    if (r->n + more <= r->cap)
        return ER_OK;
    int cap = (r->cap ? r->cap * 2 : 64);
    while (cap < r->n + more)
        cap *= 2;
    float *x = er_realloc_array(r->x, (size_t)cap * r->C, sizeof(float));
    if (!x)
        return ER_ENOMEM;
    r->x = x;
    float *y = er_realloc_array(r->y, (size_t)cap, sizeof(float));
    if (!y)
        return ER_ENOMEM;
    r->y = y;
    r->cap = cap;
    return ER_OK;
}

void head_rows_free(HeadRows *r) {
    er_free(r->x);
    er_free(r->y);
    memset(r, 0, sizeof *r);
}

int head_rows_gather(HeadRows *r) {
    if (dist_size() == 1)
        return ER_OK;
    void *x = NULL, *y = NULL;
    size_t nx, ny;
    int rc = ER_OK;
    ER_CHECK(dist_gather(r->x, (size_t)r->n * r->C, sizeof(float), &x, &nx));
    ER_CHECK(dist_gather(r->y, (size_t)r->n, sizeof(float), &y, &ny));
    if (ny > INT32_MAX / 2 || nx != ny * (size_t)r->C)
        ER_CHECK(er_error(ER_ERANGE, "heads: gathered %zu features for %zu rows of %d", nx, ny, r->C));
    er_free(r->x);
    er_free(r->y);
    r->x = x, r->y = y, r->n = r->cap = (int)ny;
    x = y = NULL;
done:
    er_free(x);
    er_free(y);
    return rc;
}

static int count_positive(const float *y, int n) {
    int pos = 0;
    for (int i = 0; i < n; i++)
        pos += y[i] > 0.5f;
    return pos;
}

// The calibration's figures. The threshold is chosen on `cal` (the calibration rows, or the training
// rows when nothing is held out) and measured on `rep`: the report rows, or `cal` itself when there
// are none (then `rep_split` says so).
typedef struct {
    const HeadRows *cal, *rep;
    const float *p_cal, *p_rep;
    const char *cal_split, *rep_split; // "calibration" | "training", "report" | "calibration" | "training"
    double auc_t, auc_v, auc_r, acc_t, acc_c, acc_r;
    int pos, cpos, rpos, tp; // positives: training, calibration, report; report positives at or above the threshold
} HeadScores;

static void add_counts(cJSON *labels, const char *split, int n, int pos) {
    cJSON *o = cJSON_AddObjectToObject(labels, split);
    cJSON_AddNumberToObject(o, "rows", n);
    cJSON_AddNumberToObject(o, "positive", pos);
}

static int add_metrics(TrainedHead *t, const HeadRows *tr, const HeadRows *cal, const HeadRows *rep,
                       const HeadFitResult *fr, const HeadScores *sc, double target) {
    cJSON *j = t->metrics = cJSON_CreateObject();
    if (!j)
        return ER_ENOMEM;
    cJSON_AddNumberToObject(j, "n_train", tr->n);
    cJSON_AddNumberToObject(j, "n_val", cal->n + rep->n);
    cJSON_AddNumberToObject(j, "n_calibration", cal->n);
    cJSON_AddNumberToObject(j, "n_report", rep->n);
    cJSON *labels = cJSON_AddObjectToObject(j, "labels");
    add_counts(labels, "train", tr->n, sc->pos);
    add_counts(labels, "calibration", cal->n, sc->cpos);
    add_counts(labels, "report", rep->n, sc->rpos);
    cJSON_AddNumberToObject(j, "train_positive_rate", (double)sc->pos / tr->n);
    cJSON_AddNumberToObject(j, "train_loss_first", fr->first_loss);
    cJSON_AddNumberToObject(j, "train_loss_last", fr->last_loss);
    if (isfinite(fr->val_loss))
        cJSON_AddNumberToObject(j, "val_loss", fr->val_loss);
    if (isfinite(sc->auc_t))
        cJSON_AddNumberToObject(j, "train_roc_auc", sc->auc_t);
    if (isfinite(sc->auc_v))
        cJSON_AddNumberToObject(j, "val_roc_auc", sc->auc_v); // every held-out row: no threshold involved
    cJSON_AddNumberToObject(j, "train_accuracy", sc->acc_t);
    cJSON_AddStringToObject(j, "threshold_split", sc->cal_split);
    cJSON_AddNumberToObject(j, "calibration_accuracy", sc->acc_c);
    cJSON_AddStringToObject(j, "report_split", sc->rep_split);
    if (isfinite(sc->auc_r))
        cJSON_AddNumberToObject(j, "report_roc_auc", sc->auc_r);
    cJSON_AddNumberToObject(j, "report_accuracy", sc->acc_r);
    int rpos = sc->rep == rep ? sc->rpos : count_positive(sc->rep->y, sc->rep->n);
    if (rpos > 0)
        cJSON_AddNumberToObject(j, "report_recall", (double)sc->tp / rpos);
    cJSON_AddNumberToObject(j, "threshold", t->threshold);
    cJSON_AddStringToObject(j, "threshold_rule", target > 0 ? "target_recall" : "best_accuracy");
    if (target > 0)
        cJSON_AddNumberToObject(j, "target_recall", target);
    return ER_OK;
}

// A head fitted on rows of one label learns a constant: refused unless s->allow_one_class, then said
// loudly. A best-accuracy threshold chosen on one label (a target recall: on no positive) is arbitrary,
// and one label among the report rows makes the report's figures weak: said loudly (the verifier's
// threshold is not used at run time, and a switcher's degenerate threshold of 1 is refused by it).
static int check_classes(const HeadRows *tr, const HeadRows *cal, const HeadRows *rep, const HeadScores *sc,
                         const HeadTrainSpec *s) {
    const char *name = s->fit.label, *what = s->positive ? s->positive : "label 1";
    char counts[400];
    snprintf(counts, sizeof counts, "%s in %d of %d training rows, %d of %d calibration rows, %d of %d report rows",
             what, sc->pos, tr->n, sc->cpos, cal->n, sc->rpos, rep->n);
    if (sc->pos == 0 || sc->pos == tr->n) {
        if (!s->allow_one_class)
            return er_error(ER_EINVAL, "%s: the training rows hold one class (%s): a head fitted on one class "
                            "separates nothing; use more records (--limit, --val-split) or pass --allow-one-class "
                            "to write it anyway", name, counts);
        if (s->log)
            fprintf(s->log, "%s: WARNING: the training rows hold one class (%s): this head separates nothing; "
                    "written anyway (--allow-one-class)\n", name, counts);
    }
    if (cal->n > 0 && (sc->cpos == 0 || (sc->cpos == cal->n && !(s->target_recall > 0))) && s->log)
        fprintf(s->log, "%s: WARNING: the calibration rows hold one class (%s): the threshold chosen on them is "
                "arbitrary; use more records or a larger --val-split\n", name, counts);
    if (rep->n > 0 && (sc->rpos == 0 || sc->rpos == rep->n) && s->log)
        fprintf(s->log, "%s: WARNING: the report rows hold one class (%s): no ROC-AUC there, and the accuracy "
                "counts that class only\n", name, counts);
    return ER_OK;
}

// Every held-out row (calibration, then report) in one HeadRows, for the loss and ROC-AUC per epoch.
static int held_out_rows(const HeadRows *cal, const HeadRows *rep, HeadRows *va) {
    *va = (HeadRows){.C = cal->C};
    ER_TRY(head_rows_reserve(va, cal->n + rep->n > 0 ? cal->n + rep->n : 1));
    if (cal->n > 0) { // an empty split may hold no buffers (memcpy from NULL is undefined even for 0 bytes)
        memcpy(va->x, cal->x, sizeof(float) * (size_t)cal->n * cal->C);
        memcpy(va->y, cal->y, sizeof(float) * (size_t)cal->n);
    }
    if (rep->n > 0) {
        memcpy(va->x + (size_t)cal->n * cal->C, rep->x, sizeof(float) * (size_t)rep->n * rep->C);
        memcpy(va->y + cal->n, rep->y, sizeof(float) * (size_t)rep->n);
    }
    va->n = cal->n + rep->n;
    return ER_OK;
}

// The threshold on sc->cal, the figures on every split.
static void calibrate(TrainedHead *t, const HeadRows *tr, const HeadRows *va, const float *pt, const float *pv,
                      double target, HeadScores *sc) {
    t->threshold = threshold_choose(sc->p_cal, sc->cal->y, sc->cal->n, target);
    sc->auc_t = roc_auc(pt, tr->y, tr->n);
    sc->auc_v = roc_auc(pv, va->y, va->n);
    sc->auc_r = roc_auc(sc->p_rep, sc->rep->y, sc->rep->n);
    sc->acc_t = accuracy_at(pt, tr->y, tr->n, t->threshold);
    sc->acc_c = accuracy_at(sc->p_cal, sc->cal->y, sc->cal->n, t->threshold);
    sc->acc_r = accuracy_at(sc->p_rep, sc->rep->y, sc->rep->n, t->threshold);
    sc->tp = 0;
    for (int i = 0; i < sc->rep->n; i++)
        sc->tp += sc->rep->y[i] > 0.5f && sc->p_rep[i] >= t->threshold;
}

int head_train(TrainedHead *t, const HeadRows *tr, const HeadRows *cal, const HeadRows *rep, const HeadTrainSpec *s,
               cJSON *results) {
    const char *name = s->fit.label;
    if (tr->n < 2)
        return er_error(ER_EINVAL, "%s: %d training rows; need at least 2 (more records, or a smaller --val-split)",
                        name, tr->n);
    HeadScores sc = {.pos = count_positive(tr->y, tr->n), .cpos = count_positive(cal->y, cal->n),
                     .rpos = count_positive(rep->y, rep->n)};
    ER_TRY(check_classes(tr, cal, rep, &sc, s));
    if (s->log)
        fprintf(s->log, "%s: training on %d rows (%.1f%% positive); %d rows calibrate the threshold, %d report\n",
                name, tr->n, 100.0 * sc.pos / tr->n, cal->n, rep->n);
    int rc = ER_OK;
    HeadRows va = {0};
    float *pt = er_alloc(sizeof(float) * (size_t)tr->n);
    float *pv = er_alloc(sizeof(float) * (size_t)(cal->n + rep->n > 0 ? cal->n + rep->n : 1));
    HeadFitResult fr;
    if (!pt || !pv)
        ER_CHECK(er_error(ER_ENOMEM, "%s: out of memory for %d scores", name, tr->n + cal->n + rep->n));
    ER_CHECK(held_out_rows(cal, rep, &va));
    ER_CHECK(head_fit(&t->net, tr->x, tr->y, tr->n, va.x, va.y, va.n, &s->fit, &fr));
    ER_CHECK(head_predict(&t->net, tr->x, tr->n, pt));
    if (va.n > 0)
        ER_CHECK(head_predict(&t->net, va.x, va.n, pv));
    // Calibrate on the calibration rows (the training rows when nothing is held out) and report on
    // the report rows (the calibration rows when there are none).
    int held = cal->n > 0;
    sc.cal = held ? cal : tr;
    sc.p_cal = held ? pv : pt;
    sc.cal_split = held ? "calibration" : "training";
    sc.rep = rep->n > 0 ? rep : sc.cal;
    sc.p_rep = rep->n > 0 ? pv + cal->n : sc.p_cal;
    sc.rep_split = rep->n > 0 ? "report" : sc.cal_split;
    calibrate(t, tr, &va, pt, pv, s->target_recall, &sc);
    ER_CHECK(add_metrics(t, tr, cal, rep, &fr, &sc, s->target_recall));
    cJSON_AddItemToObject(results, name, cJSON_Duplicate(t->metrics, 1));
    char auc_s[32] = "n/a (one class)";
    if (isfinite(va.n > 0 ? sc.auc_v : sc.auc_t))
        snprintf(auc_s, sizeof auc_s, "%.4f", va.n > 0 ? sc.auc_v : sc.auc_t);
    if (s->out)
        fprintf(s->out, "%s: %s ROC-AUC %s; accuracy %.4f on the %d %s rows%s at threshold %.4f (%s, chosen on the "
                "%d %s rows); train loss %.4f -> %.4f\n", name, va.n > 0 ? "held-out" : "training (nothing held out)",
                auc_s, sc.acc_r, sc.rep->n, sc.rep_split, rep->n > 0 ? "" : " (none held out to report on)",
                t->threshold, s->target_recall > 0 ? "target recall" : "best accuracy", sc.cal->n, sc.cal_split,
                fr.first_loss, fr.last_loss);
done:
    head_rows_free(&va);
    er_free(pt);
    er_free(pv);
    return rc;
}

int head_save(const TrainedHead *t, const char *name, const char *path, FILE *out) {
    ER_TRY(trained_head_save(t, path));
    if (out)
        fprintf(out, "%s: wrote %s\n", name, path);
    return ER_OK;
}
