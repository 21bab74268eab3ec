// ertrain sft: a masked LoRA adapter trained on a frozen base model; the result is a PEFT adapter.
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/threads.h"
#include "lora/peft.h"
#include "train/run.h"
#include "train/trainer.h"

static int save_adapter(void *ctx, const char *out_dir) { return peft_save((const LoraAdapter *)ctx, out_dir); }

static cJSON *model_info(const char *dir, const ModelConfig *mc) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "base", dir);
    cJSON_AddNumberToObject(j, "hidden_size", mc->C);
    cJSON_AddNumberToObject(j, "num_hidden_layers", mc->L);
    cJSON_AddNumberToObject(j, "vocab_size", mc->V);
    cJSON_AddNumberToObject(j, "parameters", (double)model_config_num_params(mc));
    return j;
}

int train_sft(const TrainConfig *c, TrainResult *res) {
    if (res)
        memset(res, 0, sizeof *res);
    if (!c->model_dir)
        return er_error(ER_EINVAL, "--model is required");
    ER_TRY(train_config_check(c));
    if (c->rank < 1)
        return er_error(ER_EINVAL, "--rank must be >= 1 (got %d)", c->rank);
    if (!(c->alpha > 0))
        return er_error(ER_EINVAL, "--alpha must be > 0 (got %g)", c->alpha);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return er_error(ER_EINVAL, "--dropout must be in [0, 1) (got %g)", c->dropout);
    unsigned targets;
    ER_TRY(lora_targets_parse(c->targets ? c->targets : "all", &targets));
    ER_TRY(run_dir_check(c->out_dir, c->resume ? RUN_RESUME : RUN_NEW));
    threads_set(c->threads);

    Tokenizer *tok = NULL;
    Model m;
    LoraAdapter a;
    int have_model = 0, have_adapter = 0;
    cJSON *info = NULL;
    ChatStyle style;
    int rc = tok_load(&tok, c->model_dir);
    if (rc == ER_OK)
        rc = train_chat_style(c->model_dir, &style);
    if (rc == ER_OK && (rc = model_load(&m, c->model_dir, 0)) == ER_OK)
        have_model = 1;
    if (rc == ER_OK) {
        LoraShape s = {m.cfg.L, m.cfg.C, m.cfg.NH * m.cfg.HS, m.cfg.NKV * m.cfg.HS, m.cfg.FF};
        rc = lora_init(&a, &s, c->rank, (float)c->alpha, c->rslora, (float)c->dropout, targets, 1,
                       train_derived_seed(c->seed, TRAIN_STREAM_INIT));
        have_adapter = rc == ER_OK;
    }
    const char *prefix = c->prefix ? c->prefix : "";
    if (rc == ER_OK) {
        a.masked = !c->no_mask;
        a.reasoning_prefix = prefix[0] ? er_strdup(prefix) : NULL;
        a.base_model = er_strdup(c->model_dir);
        info = model_info(c->model_dir, &m.cfg);
        if ((prefix[0] && !a.reasoning_prefix) || !a.base_model || !info)
            rc = ER_ENOMEM;
    }
    if (rc == ER_OK) {
        TrainJob job = {
            .cfg = c,
            .label = "sft",
            .model = &m,
            .adapter = &a,
            .params = a.params,
            .grads = a.grads,
            .n = a.n_params,
            .decay_mask = NULL,
            .tok = tok,
            .style = style,
            .prefix = prefix,
            .model_info = info,
            .save_final = save_adapter,
            .save_ctx = &a,
        };
        rc = trainer_run(&job, res);
    }
    cJSON_Delete(info);
    if (have_adapter)
        lora_free(&a);
    if (have_model)
        model_free(&m);
    tok_free(tok);
    return rc;
}
