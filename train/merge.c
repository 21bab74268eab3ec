// ertrain merge: the adapter added into the base's fp32 projections (train/merge.h).
#include "train/merge.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/threads.h"
#include "lora/peft.h"
#include "model/model.h"
#include "train/run.h"

// The base linear that target t of layer l adapts.
static Weight *target_weight(Model *m, int l, LoraTarget t) {
    LayerWeights *lw = &m->layers[l];
    Weight *w[LT_COUNT] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->wgate, &lw->wup, &lw->wdown};
    return w[t];
}

static ParamTensor *param_of(Model *m, const Weight *w) {
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].w == w)
            return &m->params[i];
    return NULL;
}

// Every matrix fp32: a packed or bf16 matrix has no fp32 values to add to.
static int check_fp32(const Model *m, const char *dir) {
    if (m->quant.enabled)
        return er_error(ER_EUNSUPPORTED, "%s is a quantized model: merge into its float model, then quantize the "
                        "merged dir (ertrain quantize)", dir);
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        if (p->w && p->w->fmt != WF_F32)
            return er_error(ER_EUNSUPPORTED, "%s: \"%s\" is stored as %s; ertrain merge takes an fp32 base (merging "
                            "into %s would round the merged weights)", dir, p->name, weight_format_name(p->w->fmt),
                            weight_format_name(p->w->fmt));
    }
    return ER_OK;
}

// W + scale · B·A as a new fp32 matrix owned by the model (the loaded one is a read-only mapping).
static int merge_one(Model *m, Weight *w, const LoraMat *lm, const LoraAdapter *a) {
    ParamTensor *p = param_of(m, w);
    if (!p || lm->in != w->cols || lm->out != w->rows)
        return er_error(ER_EINVAL, "merge: the adapter's [%d, %d] update does not fit \"%s\" [%d, %d]", lm->out,
                        lm->in, p ? p->name : "?", w->rows, w->cols);
    size_t n = (size_t)w->rows * (size_t)w->cols;
    float *W = er_alloc(n * sizeof(float));
    if (!W)
        return er_error(ER_ENOMEM, "merge: cannot allocate %.1f MiB for \"%s\"", n * 4.0 / 1048576.0, p->name);
    memcpy(W, w->data, n * sizeof(float));
    lora_merge_into(W, lm, a->r, a->scale, 1.0f);
    Weight merged = {.fmt = WF_F32, .rows = w->rows, .cols = w->cols, .data = W, .owned = W};
    int rc = model_set_weight(m, p, &merged);
    if (rc < 0)
        er_free(W);
    return rc;
}

static int merge_adapter(Model *m, const LoraAdapter *a, int *merged) {
    if (a->L != m->cfg.L)
        return er_error(ER_EINVAL, "merge: the adapter has %d layers, the model %d", a->L, m->cfg.L);
    *merged = 0;
    for (int l = 0; l < a->L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            const LoraMat *lm = lora_mat(a, l, (LoraTarget)t);
            if (!lm)
                continue;
            ER_TRY(merge_one(m, target_weight(m, l, (LoraTarget)t), lm, a));
            (*merged)++;
        }
    return ER_OK;
}

static int write_run_json(const MergeConfig *c, const char *dir, const LoraAdapter *a, const MergeResult *res) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return ER_ENOMEM;
    cJSON_AddStringToObject(j, "version", ERTRAIN_VERSION);
    cJSON_AddStringToObject(j, "command", "merge");
    run_add_path(j, "model", c->model_dir);
    run_add_path(j, "adapter", c->adapter_dir);
    cJSON_AddBoolToObject(j, "adapter_masked", a->masked);
    const RunNumber nums[] = {
        {"rank", a->r},
        {"alpha", a->alpha},
        {"scale", a->scale},
        {"merged_matrices", res->merged},
        {"parameters", (double)res->parameters},
    };
    run_add_numbers(j, nums, sizeof nums / sizeof nums[0]);
    int rc = run_write_json(dir, j);
    cJSON_Delete(j);
    return rc;
}

int merge_run(const MergeConfig *c, MergeResult *res) {
    if (res)
        memset(res, 0, sizeof *res);
    if (!c->model_dir || !c->adapter_dir || !c->out_dir)
        return er_error(ER_EINVAL, "merge: the base model dir, the adapter dir and the output dir are required");
    ER_TRY(dir_output_not_input(c->out_dir, c->model_dir, "--model"));
    ER_TRY(dir_output_not_input(c->out_dir, c->adapter_dir, "--adapter"));
    ER_TRY(run_dir_check(c->out_dir, RUN_ONCE, NULL));
    threads_set(c->threads);
    Model m = {0};
    LoraAdapter a = {0};
    MergeResult r = {0};
    char *tok = path_join(c->model_dir, "tokenizer.json"), *stage = NULL;
    int rc = ER_OK;
    if (!tok)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(model_load(&m, c->model_dir, 0));
    ER_CHECK(check_fp32(&m, c->model_dir));
    LoraShape s = model_config_lora_shape(&m.cfg);
    ER_CHECK(peft_load(&a, c->adapter_dir, &s, 0));
    ER_CHECK(merge_adapter(&m, &a, &r.merged));
    r.masked = a.masked;
    r.parameters = model_config_num_params(&m.cfg);
    // Written beside --out and renamed onto it once whole: a failed write leaves no half a model.
    ER_CHECK(dir_stage_open(c->out_dir, &stage));
    ER_CHECK(model_save(&m, stage, 0));
    if (gguf_is_path(c->model_dir) || path_exists(tok))
        ER_CHECK(run_copy_tokenizer(c->model_dir, stage));
    ER_CHECK(write_run_json(c, stage, &a, &r));
    rc = dir_stage_commit(stage, c->out_dir);
    stage = NULL;
    ER_CHECK(rc);
    if (res)
        *res = r;
done:
    dir_stage_abort(stage);
    er_free(tok);
    lora_free(&a);
    model_free(&m);
    return rc;
}
