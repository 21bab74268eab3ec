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
    ER_TRY(train_out_check(c));
    threads_set(c->threads);

    Tokenizer *tok = NULL;
    Model m = {0};
    LoraAdapter a = {0};
    cJSON *info = NULL;
    ChatStyle style;
    int rc = ER_OK;
    ER_CHECK(tok_load(&tok, c->model_dir));
    ER_CHECK(train_chat_style(c->model_dir, &style));
    ER_CHECK(model_load(&m, c->model_dir, 0));
    LoraShape s = model_config_lora_shape(&m.cfg);
    ER_CHECK(lora_init(&a, &s, c->rank, (float)c->alpha, c->rslora, (float)c->dropout, targets, 1,
                       train_derived_seed(c->seed, TRAIN_STREAM_INIT)));
    const char *prefix = c->prefix ? c->prefix : "";
    a.masked = !c->no_mask;
    a.reasoning_prefix = prefix[0] ? er_strdup(prefix) : NULL;
    a.base_model = er_strdup(c->model_dir);
    info = train_model_info("base", c->model_dir, &m.cfg, model_config_num_params(&m.cfg));
    if ((prefix[0] && !a.reasoning_prefix) || !a.base_model || !info)
        ER_CHECK(ER_ENOMEM);
    TrainJob job;
    train_job_init(&job, c, "sft", &m, tok, style, info, save_adapter, &a);
    job.adapter = &a;
    job.params = a.params;
    job.grads = a.grads;
    job.n = a.n_params;
    job.prefix = prefix;
    ER_CHECK(trainer_run(&job, res));
done:
    cJSON_Delete(info);
    lora_free(&a);
    model_free(&m);
    tok_free(tok);
    return rc;
}
