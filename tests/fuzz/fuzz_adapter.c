// fuzz_adapter: the input is adapter_config.json FUZZ_SEP adapter_model.safetensors, written as a PEFT
// adapter dir and loaded by peft_load (lora/peft.h) for the tiny-base model's shapes (4 layers, hidden
// 128, q 4x32, kv 2x32, MLP 384). An adapter that loads is applied once with lora_forward and saved with
// peft_save, and the saved copy must load back to the same numbers.
#include "tests/fuzz/fuzz_common.h"

#include "core/alloc.h"
#include "core/error.h"
#include "lora/lora.h"
#include "lora/peft.h"

// models/tiny-base/config.json
static const LoraShape tiny = {.L = 4, .C = 128, .q_dim = 4 * 32, .kv_dim = 2 * 32, .FF = 384};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("adapter");
    fuzz_mkdir("adapter");
    return 0;
}

static void apply_once(const LoraAdapter *a) {
    static float x[384], out[384], h[64];
    for (int i = 0; i < 384; i++)
        x[i] = 1.0f / (float)(i + 1);
    for (int l = 0; l < a->L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            const LoraMat *m = lora_mat(a, l, (LoraTarget)t);
            FUZZ_CHECK(!m == !(a->targets & (1u << t)), "layer %d target %d present %d", l, t, m != NULL);
            if (!m)
                continue;
            FUZZ_CHECK(m->A && m->B && m->in > 0 && m->in <= 384 && m->out > 0 && m->out <= 384, "matrix shape");
            if (a->r > (int)(sizeof h / sizeof h[0]))
                continue;
            memset(out, 0, sizeof out);
            FUZZ_CHECK(lora_forward(out, h, x, m, a->r, a->scale, NULL, 1) == ER_OK, "lora_forward: %s",
                       er_last_error());
        }
}

static int same_str(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

static void check_save_load(const LoraAdapter *a, int with_grads) {
    char path[FUZZ_PATH_MAX];
    fuzz_path(path, "saved");
    if (peft_save(a, path) < 0) {
        fuzz_check_save_failure("peft_save of a loaded adapter");
        return;
    }
    LoraAdapter b;
    int rc = peft_load(&b, path, &tiny, with_grads);
    FUZZ_CHECK(rc == ER_OK, "a saved adapter does not load: %s", er_last_error());
    FUZZ_CHECK(b.L == a->L && b.r == a->r && b.alpha == a->alpha && b.scale == a->scale && b.rslora == a->rslora &&
                   b.dropout == a->dropout && b.targets == a->targets && b.masked == a->masked &&
                   b.n_params == a->n_params && same_str(b.reasoning_prefix, a->reasoning_prefix) &&
                   same_str(b.base_model, a->base_model),
               "adapter changed in a save / load round trip");
    FUZZ_CHECK(memcmp(b.params, a->params, a->n_params * sizeof(float)) == 0, "weights changed in a round trip");
    lora_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    static const char *const names[2] = {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"};
    fuzz_write_parts(data, size, names, 2, part, len);
    char path[FUZZ_PATH_MAX];
    int with_grads = (int)(size & 1);
    LoraAdapter a;
    int rc = peft_load(&a, fuzz_path(path, "adapter"), &tiny, with_grads);
    if (rc < 0) {
        FUZZ_CHECK(a.mats == NULL, "failed load left matrices");
        return fuzz_refused("refused");
    }
    FUZZ_CHECK(a.L == tiny.L && a.r >= 1 && a.targets && !(a.targets & ~LORA_ALL_TARGETS), "loaded adapter shape");
    FUZZ_CHECK(!with_grads || a.grads, "no gradients");
    apply_once(&a);
    check_save_load(&a, with_grads);
    lora_free(&a);
    return 0;
}
