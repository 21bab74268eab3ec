#include "switcher_train/head_fit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
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
    *loss = rc == ER_OK ? head_bce(logit, y, n, NULL) : NAN;
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
    for (size_t i = 0; i < (size_t)n * C; i++)
        if (!isfinite(x[i]))
            return er_error(ER_ERANGE, "%s: training row %zu, feature %zu is not finite", c->label, i / C, i % C);
    for (size_t i = 0; i < (size_t)n_val * C; i++)
        if (!isfinite(xv[i]))
            return er_error(ER_ERANGE, "%s: held-out row %zu, feature %zu is not finite", c->label, i / C, i % C);
    float *mean = er_calloc((size_t)C, sizeof(float)), *sd = er_calloc((size_t)C, sizeof(float));
    float *xs = er_alloc(sizeof(float) * (size_t)n * C), *xvs = NULL;
    float *xb = er_alloc(sizeof(float) * (size_t)B * C), *yb = er_alloc(sizeof(float) * (size_t)B);
    float *logit = er_alloc(sizeof(float) * (size_t)B), *dlogit = er_alloc(sizeof(float) * (size_t)B);
    int *order = er_alloc(sizeof(int) * (size_t)n);
    if (n_val > 0)
        xvs = er_alloc(sizeof(float) * (size_t)n_val * C);
    HeadActs acts = {0};
    AdamW opt = {0};
    int rc = mean && sd && xs && xb && yb && logit && dlogit && order && (n_val <= 0 || xvs) ? ER_OK : ER_ENOMEM;
    if (rc == ER_OK)
        rc = head_acts_alloc(&acts, h, B);
    if (rc == ER_OK)
        rc = adamw_init(&opt, h->n_params, c->lr, 0.9, 0.999, 1e-8, c->weight_decay);
    if (rc == ER_OK) {
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
        for (int r = 0; r < n_val; r++)
            for (int i = 0; i < C; i++)
                xvs[(size_t)r * C + i] = (xv[(size_t)r * C + i] - mean[i]) / sd[i];
        for (int i = 0; i < n; i++)
            order[i] = i;
    }
    // Weight decay on weights, not on biases.
    unsigned char *decay = rc == ER_OK ? er_calloc(h->n_params, 1) : NULL;
    if (rc == ER_OK && !decay)
        rc = ER_ENOMEM;
    if (rc == ER_OK) {
        memset(decay, 1, (size_t)h->hidden * C);
        if (h->w2)
            memset(decay + (h->w2 - h->params), 1, (size_t)h->hidden);
    }
    ErRng rng;
    rng_seed(&rng, c->seed);
    for (int ep = 0; rc == ER_OK && ep < c->epochs; ep++) {
        shuffle_indices(order, n, &rng);
        double sum = 0;
        for (int s = 0; rc == ER_OK && s < n; s += B) {
            int nb = n - s < B ? n - s : B;
            for (int k = 0; k < nb; k++) {
                const float *src = xs + (size_t)order[s + k] * C;
                float *dst = xb + (size_t)k * C;
                for (int i = 0; i < C; i++)
                    dst[i] = src[i] + (c->noise > 0 ? c->noise * rng_normal(&rng) : 0.0f);
                yb[k] = y[order[s + k]];
            }
            head_zero_grad(h);
            rc = head_forward(h, xb, nb, logit, &acts, &rng);
            if (rc < 0)
                break;
            sum += head_bce(logit, yb, nb, dlogit) * nb;
            rc = head_backward(h, xb, dlogit, nb, &acts);
            if (rc == ER_OK)
                adamw_step(&opt, h->params, h->grads, decay, c->lr);
        }
        if (rc < 0)
            break;
        double loss = sum / n, vloss = NAN;
        if (!isfinite(loss)) {
            rc = er_error(ER_ERANGE, "%s: the training loss is not finite at epoch %d", c->label, ep + 1);
            break;
        }
        if (ep == 0)
            res->first_loss = loss;
        res->last_loss = loss;
        if (n_val > 0)
            rc = eval_loss(h, xvs, yv, n_val, &vloss);
        res->val_loss = vloss;
        if (rc == ER_OK && c->metrics) {
            cJSON *line = cJSON_CreateObject();
            if (!line) {
                rc = ER_ENOMEM;
                break;
            }
            cJSON_AddStringToObject(line, "head", c->label);
            cJSON_AddNumberToObject(line, "step", ep + 1);
            cJSON_AddNumberToObject(line, "loss", loss);
            if (isfinite(vloss))
                cJSON_AddNumberToObject(line, "val_loss", vloss);
            rc = metrics_write(c->metrics, line);
            cJSON_Delete(line);
        }
    }
    if (rc == ER_OK)
        fold_standardisation(h, mean, sd);
    adamw_free(&opt);
    head_acts_free(&acts);
    er_free(decay);
    er_free(mean);
    er_free(sd);
    er_free(xs);
    er_free(xvs);
    er_free(xb);
    er_free(yb);
    er_free(logit);
    er_free(dlogit);
    er_free(order);
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
        float *ps = er_alloc(sizeof(float) * (size_t)pos);
        if (!ps)
            return 0.5f;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (y[i] > 0.5f)
                ps[k++] = score[i];
        // Descending: the need-th highest positive score keeps `need` positives at or above it.
        ScoreLabel *v = er_alloc(sizeof(ScoreLabel) * (size_t)pos);
        if (!v) {
            er_free(ps);
            return 0.5f;
        }
        for (int i = 0; i < pos; i++)
            v[i] = (ScoreLabel){ps[i], 1};
        qsort(v, (size_t)pos, sizeof *v, by_score);
        int need = (int)ceil(target_recall * pos - 1e-9);
        if (need < 1)
            need = 1;
        if (need > pos)
            need = pos;
        float t = v[pos - need].s;
        er_free(v);
        er_free(ps);
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
