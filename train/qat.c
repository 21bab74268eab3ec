// ertrain qat: fake quantization + STE on the shared training loop (see train/qat.h).
#include "train/qat.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "quant/quant.h"
#include "quant/quantizer.h"
#include "quant/transform.h"
#include "train/run.h"

// ---- the fake-quantization step ----

typedef struct {
    const ParamTensor *p;
    QuantOptions qo;
    size_t off; // of the matrix in param_mem and in the masters
    Weight cb;  // k-means formats: the weight of the last clustering (its codebooks are used)
} QatMat;

struct QatState {
    Model *m;
    const float *master;
    const float *const *importance; // per parameter, or NULL
    QatMat *mats;
    int n_mats, K;
    long clustered_at, written_at; // LONG_MIN: never
};

// Codebook formats fit their levels by k-means (q2rtn's uniform levels are re-quantized every step).
static int is_kmeans(const QuantOptions *o) { return weight_format_info(o->fmt)->levels && !o->uniform; }

void qat_state_free(QatState *s) {
    if (!s)
        return;
    for (int i = 0; i < s->n_mats; i++)
        weight_free(&s->mats[i].cb);
    er_free(s->mats);
    er_free(s);
}

int qat_state_init(QatState **out, Model *m, const float *master, const QuantizeOptions *o,
                   const float *const *importance, int recluster_every) {
    *out = NULL;
    if (!m->trainable)
        return er_error(ER_EINVAL, "qat: the model must be loaded trainable (fp32 weights and gradients)");
    if (recluster_every < 1)
        return er_error(ER_EINVAL, "--recluster-every must be >= 1 (got %d)", recluster_every);
    QuantizePlan plan;
    ER_TRY(quantize_plan(m, o, &plan));
    QatState *s = er_calloc(1, sizeof *s);
    if (!s || !(s->mats = er_calloc((size_t)m->n_params, sizeof(QatMat)))) {
        er_free(s);
        return er_error(ER_ENOMEM, "qat: out of memory");
    }
    s->m = m;
    s->master = master;
    s->importance = importance;
    s->K = recluster_every;
    s->clustered_at = s->written_at = LONG_MIN;
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        QuantOptions qo;
        quantize_plan_options(m, &plan, o, p, &qo);
        if (!weight_is_quantized(qo.fmt))
            continue;
        qo.sparse = 0; // the fake quantizer is the dense codebook's (quantize adds any sparse corrections after)
        QatMat *q = &s->mats[s->n_mats++];
        q->p = p;
        q->qo = qo;
        q->off = (size_t)(p->data - m->param_mem);
    }
    *out = s;
    return ER_OK;
}

int qat_state_apply(QatState *s, long step) {
    if (step >= 0 && step == s->written_at)
        return ER_OK;
    Model *m = s->m;
    memcpy(m->param_mem, s->master, m->n_param_floats * sizeof(float));
    int recluster = s->clustered_at == LONG_MIN || ((step < 0 || step % s->K == 0) && step != s->clustered_at);
    for (int i = 0; i < s->n_mats; i++) {
        QatMat *q = &s->mats[i];
        int R = (int)q->p->shape[0], C = (int)q->p->shape[1];
        const float *src = s->master + q->off;
        float *dst = m->param_mem + q->off;
        if (is_kmeans(&q->qo)) {
            if (recluster) {
                weight_free(&q->cb);
                const float *imp = s->importance ? s->importance[q->p - m->params] : NULL;
                ER_TRY(quantize_matrix(&q->cb, src, R, C, imp, &q->qo));
            }
            quant_fake_quant_lut(dst, src, R, C, q->cb.lut, weight_format_info(q->qo.fmt)->levels);
        } else {
            // the importance the saved model is quantized with (qat_save): training sees the deployed quantizer
            const float *imp = s->importance ? s->importance[q->p - m->params] : NULL;
            ER_TRY(quant_fake_quant_rows(dst, src, R, C, imp, &q->qo));
        }
    }
    if (recluster)
        s->clustered_at = step;
    s->written_at = step;
    return ER_OK;
}

// ---- the command ----

enum { QAT_FISHER_RECORDS = 16 }; // training records the codebook weighting is measured on

typedef struct {
    const QatConfig *c;
    Model *m;
    const float *master;
    const QuantizeSource *src;
    const float *const *importance; // the Fisher sensitivities of the start (per parameter)
    cJSON *info; // run.json "model": the quantization report is added at the end
} QatSave;

static int qat_hook(void *ctx, long step) { return qat_state_apply(ctx, step); }

// The trained masters quantized and written as ertrain quantize writes them.
static int qat_save(void *ctx, const char *out_dir) {
    QatSave *q = ctx;
    const QatConfig *c = q->c;
    FILE *log = c->log;
    Model *m = q->m;
    memcpy(m->param_mem, q->master, m->n_param_floats * sizeof(float));
    QuantizeOptions qo = c->q;
    qo.method_note = q->importance ? "fisher-qat" : "qat";
    qo.transforms = c->transforms ? c->transforms : "none";
    QuantizeReport rep;
    double t0 = time_now();
    if (log)
        fprintf(log, "qat: quantizing the trained weights to %s:\n", c->q.weights);
    ER_TRY(quantize_model(m, &qo, q->importance, log, &rep));
    rep.bytes_before = q->src->bytes;
    rep.model_bits_per_weight = (double)rep.bytes_after * 8.0 / (double)q->src->params;
    ER_TRY(quantize_write_dir(m, c->train.model_dir, out_dir, q->src->bf16, log));
    cJSON *qc = quant_config_to_json(&m->quant);
    if (!qc)
        return ER_ENOMEM;
    cJSON_DeleteItemFromObject(q->info, "quantization_config");
    cJSON_AddItemToObject(q->info, "quantization_config", qc);
    cJSON_DeleteItemFromObject(q->info, "quantization");
    cJSON *r = cJSON_AddObjectToObject(q->info, "quantization");
    if (!r)
        return ER_ENOMEM;
    cJSON_AddNumberToObject(r, "bits_per_weight", rep.bits_per_weight);
    cJSON_AddNumberToObject(r, "model_bits_per_weight", rep.model_bits_per_weight);
    cJSON_AddNumberToObject(r, "bytes_before", (double)rep.bytes_before);
    cJSON_AddNumberToObject(r, "bytes_after", (double)rep.bytes_after);
    cJSON_AddNumberToObject(r, "mean_rel_error", rep.mean_rel_error);
    cJSON_AddNumberToObject(r, "max_rel_error", rep.max_rel_error);
    if (log) {
        fprintf(log, "qat: bits per weight %.3f (layer projections), %.3f (whole model); %.2f MiB -> %.2f MiB; relative "
                "error of the final quantization: mean %.4f, worst %.4f; %.1fs\n",
                rep.bits_per_weight, rep.model_bits_per_weight, rep.bytes_before / 1048576.0,
                rep.bytes_after / 1048576.0, rep.mean_rel_error, rep.max_rel_error, time_now() - t0);
        fflush(log);
    }
    return ER_OK;
}

// The flags, checked before the (slow) load.
static int qat_check(const QatConfig *c) {
    const TrainConfig *tc = &c->train;
    if (!tc->model_dir || !tc->data_path || !tc->out_dir)
        return er_error(ER_EINVAL, "--model, --data and --out are required");
    ER_TRY(train_config_check(tc));
    unsigned tflags;
    if (c->transforms && transform_parse_mode(c->transforms, &tflags) == ER_OK && (tflags & TRANSFORM_TRAINED))
        return er_error(ER_EINVAL, "--transforms fpt-trained: train the transforms with ertrain quantize, then run "
                        "qat on a float model (qat takes none, rotate, fpt or a list)");
    WeightFormat f;
    int g, mix, u;
    char specs[256];
    if (!c->q.weights || quantize_parse_weights(c->q.weights, &f, &g, &mix, &u) < 0)
        return er_error(ER_EINVAL, "--weights \"%s\" is not one of %s", c->q.weights ? c->q.weights : "",
                        quantize_weights_list(specs, sizeof specs, ", ", " or "));
    if (weight_format_info(f)->block)
        return er_error(ER_EINVAL, "--weights %s: the GGUF block formats have no fake quantizer to train against (qat "
                        "takes q8, q4, q4g, q4lut, q2lut or q2rtn); quantize to them with ertrain quantize",
                        c->q.weights);
    if (c->recluster_every < 1)
        return er_error(ER_EINVAL, "--recluster-every must be >= 1 (got %d)", c->recluster_every);
    if (tc->save_every > 0 && tc->save_every % c->recluster_every != 0)
        return er_error(ER_EINVAL,
                        "--save-every %d must be a multiple of --recluster-every %d (a resumed run re-clusters at its "
                        "checkpoint)",
                        tc->save_every, c->recluster_every);
    return ER_OK;
}

// run.json: the model ("model") and qat's own settings ("extra").
static void qat_describe(const QatConfig *c, const Model *m, const QuantizeSource *src, cJSON *info, cJSON *extra) {
    cJSON_AddStringToObject(info, "dir", c->train.model_dir);
    cJSON_AddNumberToObject(info, "hidden_size", m->cfg.C);
    cJSON_AddNumberToObject(info, "num_hidden_layers", m->cfg.L);
    cJSON_AddNumberToObject(info, "vocab_size", m->cfg.V);
    cJSON_AddNumberToObject(info, "parameters", (double)src->params);
    cJSON_AddStringToObject(extra, "weights", c->q.weights);
    cJSON_AddStringToObject(extra, "embeddings", c->q.embeddings ? c->q.embeddings : "int8");
    if (c->q.lm_head)
        cJSON_AddStringToObject(extra, "lm_head", c->q.lm_head);
    cJSON_AddStringToObject(extra, "transforms", c->transforms ? c->transforms : "none");
    cJSON_AddNumberToObject(extra, "recluster_every", c->recluster_every);
    cJSON_AddNumberToObject(extra, "kmeans_iters", c->q.kmeans_iters > 0 ? c->q.kmeans_iters : 25);
    cJSON_AddStringToObject(extra, "scale_search", c->q.scale_search ? c->q.scale_search : "lp");
    cJSON_AddStringToObject(extra, "ste", "straight-through: dL/dQ(W) applied to the fp32 master weights");
}

int qat_run(const QatConfig *c, TrainResult *res) {
    if (res)
        memset(res, 0, sizeof *res);
    const TrainConfig *tc = &c->train;
    ER_TRY(qat_check(c));
    ER_TRY(train_out_check(tc));
    threads_set(tc->threads);
    Model m = {0};
    QuantizeSource src;
    Tokenizer *tok = NULL;
    ChatStyle style;
    float *master = NULL, *fmem = NULL;
    const float **imp = NULL;
    unsigned char *decay = NULL;
    QatState *st = NULL;
    cJSON *info = cJSON_CreateObject(), *extra = cJSON_CreateObject();
    int rc = ER_OK;
    if (!info || !extra)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(quantize_load(&m, tc->model_dir, c->transforms, (uint64_t)(uint32_t)tc->seed, &c->q, 1,
                           c->log, &src));
    ER_CHECK(tok_load(&tok, tc->model_dir));
    ER_CHECK(train_chat_style(tc->model_dir, &style));
    master = er_alloc(m.n_param_floats * sizeof(float));
    decay = train_decay_mask(&m); // weight decay (when asked) on matrices only, as in pretraining
    if (!master || !decay)
        ER_CHECK(er_error(ER_ENOMEM, "qat: cannot allocate %.1f MiB for the master weights",
                          m.n_param_floats * 5.0 / 1048576.0));
    memcpy(master, m.param_mem, m.n_param_floats * sizeof(float));
    // The codebooks' weighting: Fisher on the first records of the training data, at the start (after the
    // plan's checks of the flags).
    QuantizePlan plan;
    ER_CHECK(quantize_plan(&m, &c->q, &plan));
    ER_CHECK(quantize_fisher(&m, tc->model_dir, tc->data_path, tc->response_key, QAT_FISHER_RECORDS,
                             tc->seq_len > 0 ? tc->seq_len : m.cfg.max_pos, &fmem, &imp));
    memcpy(m.param_mem, master, m.n_param_floats * sizeof(float));
    ER_CHECK(qat_state_init(&st, &m, master, &c->q, imp, c->recluster_every));
    qat_describe(c, &m, &src, info, extra);
    cJSON_AddNumberToObject(extra, "fisher_records", QAT_FISHER_RECORDS);
    QatSave sv = {c, &m, master, &src, imp, info};
    TrainJob job;
    train_job_init(&job, tc, "qat", &m, tok, style, info, qat_save, &sv);
    job.params = master; // the optimizer updates the fp32 master weights; qat_hook quantizes them
    job.decay_mask = decay;
    job.before_forward = qat_hook;
    job.hook_ctx = st;
    job.extra_config = extra;
    rc = trainer_run(&job, res);
done:
    qat_state_free(st);
    cJSON_Delete(info);
    cJSON_Delete(extra);
    er_free(decay);
    er_free(master);
    er_free(fmem);
    er_free(imp);
    tok_free(tok);
    model_free(&m);
    return rc;
}
