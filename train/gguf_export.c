// GGUF export of models and adapters for llama.cpp.
#include "train/gguf_export.h"

#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "lora/gguf_lora.h"
#include "lora/peft.h"
#include "model/gguf_model.h"

// tokenizer.chat_template: the source GGUF's, or tokenizer_config.json's "chat_template" (a string, or the
// "default" entry of a list); none when the source has none.
static int put_chat_template(const char *model, GgufWriter *w) {
    int rc = ER_OK;
    if (gguf_is_path(model)) {
        GgufFile f;
        const char *text = NULL;
        ER_TRY(gguf_open(&f, model));
        rc = gguf_get_str(&f, "tokenizer.chat_template", 1, &text);
        if (rc == ER_OK && text)
            rc = gguf_set_str(w, "tokenizer.chat_template", text);
        gguf_close(&f);
        return rc;
    }
    char *path = path_join(model, "tokenizer_config.json");
    cJSON *cfg = NULL;
    if (!path)
        return ER_ENOMEM;
    if (path_exists(path)) {
        ER_CHECK(json_parse_file(path, (size_t)64 << 20, &cfg));
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
        const cJSON *list = cJSON_IsArray(t) ? t : NULL;
        cJSON_ArrayForEach(e, list) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0)
                t = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
        if (cJSON_IsString(t))
            ER_CHECK(gguf_set_str(w, "tokenizer.chat_template", t->valuestring));
    }
done:
    cJSON_Delete(cfg);
    er_free(path);
    return rc;
}

int gguf_export_model(const char *model, const char *out, const char *type, FILE *log) {
    Model m = {0};
    Tokenizer *tok = NULL;
    GgufWriter w = {0};
    uint32_t t;
    int rc = ER_OK;
    ER_CHECK(model_load(&m, model, 0));
    ER_CHECK(type ? model_gguf_parse_type(type, &t) : model_gguf_default_type(&m, &t));
    ER_CHECK(tok_load(&tok, model));
    ER_CHECK(model_gguf_put(&m, t, &w, log));
    ER_CHECK(tok_gguf_put(tok, m.cfg.V, &w));
    ER_CHECK(put_chat_template(model, &w));
    ER_CHECK(gguf_write(&w, out));
    if (log)
        fprintf(log, "wrote %s: %s, %d layers, %d tensors, %s\n", out, model_gguf_arch(&m.cfg), m.cfg.L, w.n_tensors,
                t == MODEL_GGUF_NATIVE ? "each matrix in its own type" : ggml_type_name(t));
done:
    gguf_writer_free(&w);
    tok_free(tok);
    model_free(&m);
    return rc;
}

int gguf_export_lora(const char *model, const char *adapter, const char *out, FILE *log) {
    Model m = {0};
    LoraAdapter a = {0};
    GgufWriter w = {0};
    int rc = ER_OK;
    ER_CHECK(model_load(&m, model, 0));
    LoraShape shape = model_config_lora_shape(&m.cfg);
    ER_CHECK(peft_load(&a, adapter, &shape, 0));
    ER_CHECK(lora_gguf_put(&a, model_gguf_arch(&m.cfg), m.cfg.HS, &w));
    ER_CHECK(gguf_write(&w, out));
    if (log)
        fprintf(log, "wrote %s: LoRA r=%d, scale %g, %d tensors%s\n", out, a.r, a.scale, w.n_tensors,
                a.masked ? "; trained masked, llama.cpp applies it at every position (prompt included)" : "");
done:
    gguf_writer_free(&w);
    lora_free(&a);
    model_free(&m);
    return rc;
}
