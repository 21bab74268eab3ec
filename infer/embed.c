#include "infer/embed.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"

// The Pooling module's dir: modules.json names it (sentence_transformers.models.Pooling); "1_Pooling" without one.
static int pooling_dir(const char *dir, char **out) {
    char *modules = path_join(dir, "modules.json");
    cJSON *j = NULL, *it;
    int rc = ER_OK;
    *out = NULL;
    if (!modules)
        return ER_ENOMEM;
    if (path_exists(modules)) {
        ER_CHECK(json_parse_file(modules, 1 << 20, &j));
        cJSON_ArrayForEach(it, j) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
            const cJSON *path = cJSON_GetObjectItemCaseSensitive(it, "path");
            if (cJSON_IsString(type) && strstr(type->valuestring, "Pooling") && cJSON_IsString(path)) {
                if (strstr(path->valuestring, "..") || path->valuestring[0] == '/')
                    ER_CHECK(er_error(ER_EFORMAT, "%s: the Pooling module's path \"%s\" leaves the model dir", modules,
                                      path->valuestring));
                *out = path_join(dir, path->valuestring);
                goto done;
            }
        }
    }
    *out = path_join(dir, "1_Pooling");
done:
    if (rc == ER_OK && !*out)
        rc = ER_ENOMEM;
    cJSON_Delete(j);
    er_free(modules);
    return rc;
}

static int load_pooling(EmbedSpec *s, const char *dir) {
    char *pdir, *path = NULL;
    ER_TRY(pooling_dir(dir, &pdir));
    cJSON *j = NULL;
    int rc = ER_OK;
    if (!(path = path_join(pdir, "config.json")))
        ER_CHECK(ER_ENOMEM);
    if (!path_exists(path))
        goto done;
    ER_CHECK(json_parse_file(path, 1 << 20, &j));
    static const char *const modes[] = {"pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                                        "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                        "pooling_mode_lasttoken"};
    int n_on = 0;
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        int on = 0;
        ER_CHECK(json_opt_bool(j, modes[k], &on, path));
        if (!on)
            continue;
        n_on++;
        snprintf(s->mode, sizeof s->mode, "%s", modes[k]);
        s->pooling = k == 1 ? EMBED_MEAN : k == 5 ? EMBED_LAST : EMBED_UNSUPPORTED;
    }
    if (n_on > 1) // sentence-transformers concatenates several modes: a vector of another size
        snprintf(s->mode, sizeof s->mode, "%d modes at once", n_on), s->pooling = EMBED_UNSUPPORTED;
done:
    cJSON_Delete(j);
    er_free(path);
    er_free(pdir);
    return rc;
}

static int load_prompts(EmbedSpec *s, const char *dir) {
    char *path = path_join(dir, "config_sentence_transformers.json");
    cJSON *j = NULL;
    int rc = ER_OK;
    if (!path)
        return ER_ENOMEM;
    if (path_exists(path)) {
        ER_CHECK(json_parse_file(path, 1 << 20, &j));
        const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(j, "prompts");
        const char *q = NULL;
        if (prompts && !cJSON_IsNull(prompts))
            ER_CHECK(json_opt_string_named(prompts, "query", "prompts.query", &q, path));
        if (q && q[0] && !(s->query_prompt = er_strdup(q)))
            ER_CHECK(ER_ENOMEM);
    }
done:
    cJSON_Delete(j);
    er_free(path);
    return rc;
}

int embed_spec_load(EmbedSpec *s, const char *dir, const GgufFile *gguf) {
    memset(s, 0, sizeof *s);
    s->pooling = EMBED_MEAN;
    snprintf(s->mode, sizeof s->mode, "mean");
    if (gguf) { // llama.cpp's LLAMA_POOLING_TYPE: 0 none, 1 mean, 2 cls, 3 last, 4 rank
        const char *arch = NULL;
        char key[96];
        int64_t t = 1;
        ER_TRY(gguf_get_str(gguf, "general.architecture", 0, &arch));
        snprintf(key, sizeof key, "%s.pooling_type", arch);
        ER_TRY(gguf_get_int(gguf, key, 1, 0, 4, &t));
        s->pooling = t == 1 ? EMBED_MEAN : t == 3 ? EMBED_LAST : EMBED_UNSUPPORTED;
        snprintf(s->mode, sizeof s->mode, "%s %lld", key, (long long)t);
        return ER_OK;
    }
    if (!dir)
        return ER_OK;
    int rc = load_pooling(s, dir);
    if (rc == ER_OK)
        rc = load_prompts(s, dir);
    if (rc < 0)
        embed_spec_free(s);
    return rc;
}

void embed_spec_free(EmbedSpec *s) {
    er_free(s->query_prompt);
    memset(s, 0, sizeof *s);
}

void embed_finish(float *out, const float *h, int dims, int normalize) {
    double ss = 0;
    for (int i = 0; i < dims; i++)
        ss += (double)h[i] * h[i];
    float inv = normalize && ss > 0 ? (float)(1.0 / sqrt(ss)) : 1.0f;
    for (int i = 0; i < dims; i++)
        out[i] = h[i] * inv;
}
