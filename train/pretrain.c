// ertrain pretrain: every parameter of a randomly initialised model, trained on whole rendered
// conversations; the result is an HF model dir with the tokenizer next to it.
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/threads.h"
#include "train/run.h"
#include "train/trainer.h"

typedef struct {
    Model *m;
    const char *tokenizer_path;
} SaveCtx;

static int save_model(void *ctx, const char *out_dir) {
    SaveCtx *s = ctx;
    ER_TRY(model_save(s->m, out_dir, 0));
    return run_copy_tokenizer(s->tokenizer_path, out_dir);
}

int train_pretrain(const TrainConfig *c, TrainResult *res) {
    if (res)
        memset(res, 0, sizeof *res);
    if (!c->config_path || !c->tokenizer_path)
        return er_error(ER_EINVAL, "--config and --tokenizer are required");
    ER_TRY(train_config_check(c));
    if (!(c->init_std > 0))
        return er_error(ER_EINVAL, "--init-std must be > 0 (got %g)", c->init_std);
    ER_TRY(run_dir_check(c->out_dir, c->resume ? RUN_RESUME : RUN_NEW));
    threads_set(c->threads);

    ModelConfig mc;
    Tokenizer *tok = NULL;
    Model m;
    int have_model = 0;
    unsigned char *decay = NULL;
    cJSON *info = NULL;
    ChatStyle style;
    int rc = model_config_load(&mc, c->config_path);
    if (rc == ER_OK)
        rc = tok_load(&tok, c->tokenizer_path);
    if (rc == ER_OK)
        rc = train_chat_style(c->tokenizer_path, &style);
    if (rc == ER_OK && (rc = model_build_random(&m, &mc, (float)c->init_std,
                                                train_derived_seed(c->seed, TRAIN_STREAM_INIT))) == ER_OK)
        have_model = 1;
    if (rc == ER_OK) {
        // Weight decay on matrices only: norms and biases are left alone.
        decay = er_calloc(m.n_param_floats, 1);
        info = cJSON_CreateObject();
        if (!decay || !info) {
            rc = ER_ENOMEM;
        } else {
            for (int i = 0; i < m.n_params; i++) {
                const ParamTensor *p = &m.params[i];
                memset(decay + (p->data - m.param_mem), p->ndim == 2, p->numel);
            }
            cJSON_AddStringToObject(info, "config", c->config_path);
            cJSON_AddNumberToObject(info, "hidden_size", mc.C);
            cJSON_AddNumberToObject(info, "num_hidden_layers", mc.L);
            cJSON_AddNumberToObject(info, "vocab_size", mc.V);
            cJSON_AddNumberToObject(info, "parameters", (double)model_config_num_params(&mc));
        }
    }
    if (rc == ER_OK) {
        SaveCtx sc = {&m, c->tokenizer_path};
        TrainJob job = {
            .cfg = c,
            .label = "pretrain",
            .model = &m,
            .adapter = NULL,
            .params = m.param_mem,
            .grads = m.grad_mem,
            .n = m.n_param_floats,
            .decay_mask = decay,
            .tok = tok,
            .style = style,
            .prefix = "",
            .model_info = info,
            .save_final = save_model,
            .save_ctx = &sc,
        };
        rc = trainer_run(&job, res);
    }
    cJSON_Delete(info);
    er_free(decay);
    if (have_model)
        model_free(&m);
    tok_free(tok);
    return rc;
}
