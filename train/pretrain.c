// ertrain pretrain: every parameter of a randomly initialised model (or, with --init, of an existing fp32
// model: continued pretraining), trained on whole rendered conversations; the result is an HF model dir with
// the tokenizer next to it.
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
    if (!c->tokenizer_path || !c->config_path == !c->model_dir)
        return er_error(ER_EINVAL, "--tokenizer and one of --config (a random model) or --init (a model dir) are "
                                   "required");
    ER_TRY(train_config_check(c));
    if (!(c->init_std > 0))
        return er_error(ER_EINVAL, "--init-std must be > 0 (got %g)", c->init_std);
    ER_TRY(train_out_check(c));
    threads_set(c->threads);

    ModelConfig mc;
    Tokenizer *tok = NULL;
    Model m = {0};
    unsigned char *decay = NULL;
    cJSON *info = NULL;
    ChatStyle style;
    int rc = ER_OK;
    ER_CHECK(tok_load(&tok, c->tokenizer_path));
    ER_CHECK(train_chat_style(c->tokenizer_path, &style));
    if (c->model_dir) {
        ER_CHECK(model_load(&m, c->model_dir, MODEL_LOAD_TRAINABLE));
        mc = m.cfg;
    } else {
        ER_CHECK(model_config_load(&mc, c->config_path));
        ER_CHECK(model_build_random(&m, &mc, (float)c->init_std, train_derived_seed(c->seed, TRAIN_STREAM_INIT)));
    }
    decay = train_decay_mask(&m);
    info = c->model_dir ? train_model_info("init", c->model_dir, &mc, model_config_num_params(&mc))
                        : train_model_info("config", c->config_path, &mc, model_config_num_params(&mc));
    if (!decay || !info)
        ER_CHECK(ER_ENOMEM);
    SaveCtx sc = {&m, c->tokenizer_path};
    TrainJob job;
    train_job_init(&job, c, "pretrain", &m, tok, style, info, save_model, &sc);
    job.decay_mask = decay;
    ER_CHECK(trainer_run(&job, res));
done:
    cJSON_Delete(info);
    er_free(decay);
    model_free(&m);
    tok_free(tok);
    return rc;
}
