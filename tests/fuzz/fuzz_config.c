// fuzz_config: the input is a model dir's config.json. It goes to model_config_load
// (model/config.h); a config that parses is written back with model_config_to_json and re-read (the
// dimensions must survive), then model_load (model/model.h) runs on a dir holding it next to the
// committed tiny-base weights, so shape checks against a real safetensors file run too.
#include "tests/fuzz/fuzz_common.h"

#include <cjson/cJSON.h>

#include "core/error.h"
#include "model/config.h"
#include "model/model.h"

#define TINY_WEIGHTS "models/tiny-base/model.safetensors"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("config");
    fuzz_mkdir("model");
    // The weights are the committed model's; the fuzzer only varies the config. realpath: the fuzzer
    // may run from any dir, the link must not depend on it.
    char *abs = realpath(TINY_WEIGHTS, NULL);
    if (!abs) {
        fprintf(stderr, "fuzz_config: run from the project root (%s not found)\n", TINY_WEIGHTS);
        abort();
    }
    char p[FUZZ_PATH_MAX];
    if (symlink(abs, fuzz_path(p, "model/model.safetensors")) < 0) {
        perror("fuzz_config: symlink");
        abort();
    }
    free(abs);
    return 0;
}

static void check_round_trip(const ModelConfig *c) {
    cJSON *j = model_config_to_json(c);
    if (!j)
        return; // ENOMEM
    ModelConfig d;
    int rc = model_config_from_json(&d, j, "round trip");
    cJSON_Delete(j);
    FUZZ_CHECK(rc == ER_OK, "a loaded config does not re-read: %s", er_last_error());
    FUZZ_CHECK(c->arch == d.arch && c->C == d.C && c->FF == d.FF && c->L == d.L && c->NH == d.NH &&
                   c->NKV == d.NKV && c->HS == d.HS && c->V == d.V && c->max_pos == d.max_pos &&
                   c->tied == d.tied && c->qkv_bias == d.qkv_bias && c->dtype == d.dtype &&
                   c->rope_theta == d.rope_theta && c->eps == d.eps,
               "config changed in a to_json / from_json round trip");
    if (c->bos_id >= 0)
        FUZZ_CHECK(d.bos_id == c->bos_id, "bos_token_id %d -> %d", c->bos_id, d.bos_id);
    if (c->eos_id >= 0)
        FUZZ_CHECK(d.eos_id == c->eos_id, "eos_token_id %d -> %d", c->eos_id, d.eos_id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[FUZZ_PATH_MAX];
    fuzz_write("model/config.json", data, size);
    ModelConfig c;
    int rc = model_config_load(&c, fuzz_path(path, "model/config.json"));
    if (rc < 0)
        return fuzz_refused("config refused");
    FUZZ_CHECK(model_config_validate(&c, "loaded") == ER_OK, "a loaded config does not validate");
    (void)model_config_num_params(&c);
    check_round_trip(&c);

    // Odd sizes load for training (fp32 copies and gradients), even ones mmapped in place.
    int flags = (size & 1) ? MODEL_LOAD_TRAINABLE : 0;
    Model m;
    rc = model_load(&m, fuzz_path(path, "model"), flags);
    if (rc < 0)
        return fuzz_refused("model refused");
    FUZZ_CHECK(m.n_params > 0 && m.cfg.C == c.C && m.cfg.L == c.L, "loaded model disagrees with its config");
    for (int i = 0; i < m.n_params; i++)
        FUZZ_CHECK(m.params[i].numel > 0, "parameter %s is empty", m.params[i].name);
    model_free(&m);
    return 0;
}
