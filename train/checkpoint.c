#include "train/checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "train/run.h"

#define STATE_JSON "state.json"

void train_state_free(TrainState *st) {
    er_free(st->order);
    er_free(st->batch_start);
    cJSON_Delete(st->config);
    memset(st, 0, sizeof *st);
}

int checkpoint_exists(const char *dir) {
    char *p = path_join(dir, STATE_JSON);
    int ok = p && path_exists(p);
    er_free(p);
    return ok;
}

// The tensor file named in an existing state.json (to remove once a newer one is committed).
static char *previous_tensor_file(const char *dir) {
    char *p = path_join(dir, STATE_JSON);
    cJSON *j = NULL;
    char *name = NULL;
    if (p && path_exists(p) && json_parse_file(p, 1 << 26, &j) == ER_OK) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tensors");
        if (cJSON_IsString(t) && !strchr(t->valuestring, '/'))
            name = er_strdup(t->valuestring);
    }
    cJSON_Delete(j);
    er_free(p);
    er_clear_error();
    return name;
}

int checkpoint_save(const char *dir, const TrainState *st, const float *params, size_t n, const AdamW *opt) {
    if (opt->n != n)
        return er_error(ER_EINVAL, "%s: optimizer state has %zu entries for %zu parameters", dir, opt->n, n);
    ER_TRY(dir_make(dir));
    char name[64];
    snprintf(name, sizeof name, "state-%08ld.safetensors", st->step);
    char *prev = previous_tensor_file(dir);
    char *st_path = path_join(dir, name), *js_path = path_join(dir, STATE_JSON);
    cJSON *j = cJSON_CreateObject();
    int rc = ER_OK;
    if (!st_path || !js_path || !j)
        ER_CHECK(ER_ENOMEM);
    char step_s[32];
    snprintf(step_s, sizeof step_s, "%ld", st->step);
    StWriteTensor ts[5] = {
        {"params", DT_F32, 1, {(int64_t)n}, params},
        {"adam.m", DT_F32, 1, {(int64_t)n}, opt->m},
        {"adam.v", DT_F32, 1, {(int64_t)n}, opt->v},
        {"data.order", DT_I32, 1, {st->n_order}, st->order},
        {"data.batch_start", DT_I32, 1, {st->n_batches + 1}, st->batch_start},
    };
    int nt = st->batch_start ? 5 : 3;
    const char *meta[] = {"format", "ertrain-checkpoint", "step", step_s};
    ER_CHECK(safetensors_write(st_path, ts, nt, meta, 2));
    cJSON *rng = cJSON_AddArrayToObject(j, "rng");
    for (int i = 0; rng && i < 4; i++) {
        char h[24];
        snprintf(h, sizeof h, "%016" PRIx64, st->rng.s[i]);
        cJSON_AddItemToArray(rng, cJSON_CreateString(h));
    }
    cJSON_AddStringToObject(j, "format", "ertrain-checkpoint");
    cJSON_AddStringToObject(j, "version", ERTRAIN_VERSION);
    cJSON_AddNumberToObject(j, "step", (double)st->step);
    cJSON_AddNumberToObject(j, "adam_step", (double)opt->step);
    cJSON_AddNumberToObject(j, "epoch", (double)st->epoch);
    cJSON_AddNumberToObject(j, "cursor", (double)st->cursor);
    cJSON_AddNumberToObject(j, "tokens", (double)st->tokens);
    cJSON_AddNumberToObject(j, "n_params", (double)n);
    cJSON_AddNumberToObject(j, "n_batches", st->batch_start ? st->n_batches : 0);
    cJSON_AddStringToObject(j, "tensors", name);
    if (st->config)
        cJSON_AddItemToObject(j, "config", cJSON_Duplicate(st->config, 1));
    ER_CHECK(json_write_file(js_path, j));
    if (prev && strcmp(prev, name) != 0) {
        char *old = path_join(dir, prev);
        if (old)
            unlink(old);
        er_free(old);
    }
done:
    cJSON_Delete(j);
    er_free(prev);
    er_free(st_path);
    er_free(js_path);
    return rc;
}

// A 1-D tensor of n entries of dtype dt, copied into dst.
static int load_tensor(const StFile *f, const char *name, ErDType dt, size_t n, void *dst) {
    return safetensors_read_tensor(f, name, dt, 1, (const int64_t[]){(int64_t)n}, dst);
}

static int get_long(const cJSON *j, const char *key, long *out, const char *ctx) {
    int64_t v;
    ER_TRY(json_get_int(j, key, &v, ctx));
    if (v < 0)
        return er_error(ER_EFORMAT, "%s: \"%s\" must not be negative", ctx, key);
    *out = (long)v;
    return ER_OK;
}

// The counters and the RNG of state.json; *tensors points into j.
static int parse_state(const cJSON *j, const char *js_path, TrainState *st, long *adam_step, long *n_params,
                       long *n_batches, const char **tensors) {
    ER_TRY(get_long(j, "step", &st->step, js_path));
    ER_TRY(get_long(j, "adam_step", adam_step, js_path));
    ER_TRY(get_long(j, "epoch", &st->epoch, js_path));
    ER_TRY(get_long(j, "cursor", &st->cursor, js_path));
    ER_TRY(get_long(j, "tokens", &st->tokens, js_path));
    ER_TRY(get_long(j, "n_params", n_params, js_path));
    ER_TRY(get_long(j, "n_batches", n_batches, js_path));
    ER_TRY(json_get_string(j, "tensors", tensors, js_path));
    if (strchr(*tensors, '/'))
        return er_error(ER_EFORMAT, "%s: \"tensors\" must name a file in the checkpoint dir", js_path);
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(j, "rng");
    if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4)
        return er_error(ER_EFORMAT, "%s: \"rng\" must be a list of 4 hex words", js_path);
    for (int i = 0; i < 4; i++) {
        const cJSON *w = cJSON_GetArrayItem(rng, i);
        char *end = NULL;
        if (cJSON_IsString(w))
            st->rng.s[i] = strtoull(w->valuestring, &end, 16);
        if (!cJSON_IsString(w) || !w->valuestring[0] || *end)
            return er_error(ER_EFORMAT, "%s: \"rng\"[%d] is not a hex word", js_path, i);
    }
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    if (cJSON_IsObject(cfg) && !(st->config = cJSON_Duplicate(cfg, 1)))
        return ER_ENOMEM;
    return ER_OK;
}

// The epoch's data order and batch layout (n_batches batches) into st.
static int load_data_order(const StFile *f, const char *st_path, long n_batches, TrainState *st) {
    const StTensor *o = safetensors_find(f, "data.order");
    if (!o || o->ndim != 1)
        return er_error(ER_EFORMAT, "%s: tensor \"data.order\" is missing", st_path);
    st->n_order = (int)o->shape[0];
    st->n_batches = (int)n_batches;
    st->order = er_calloc((size_t)st->n_order + 1, sizeof(int));
    st->batch_start = er_calloc((size_t)n_batches + 1, sizeof(int));
    if (!st->order || !st->batch_start)
        return ER_ENOMEM;
    ER_TRY(load_tensor(f, "data.order", DT_I32, (size_t)st->n_order, st->order));
    ER_TRY(load_tensor(f, "data.batch_start", DT_I32, (size_t)n_batches + 1, st->batch_start));
    // The batch layout must index the order array, or a bad file would read out of bounds later.
    for (long b = 0; b <= n_batches; b++)
        if (st->batch_start[b] < 0 || st->batch_start[b] > st->n_order ||
            (b > 0 && st->batch_start[b] < st->batch_start[b - 1]))
            return er_error(ER_EFORMAT, "%s: \"data.batch_start\" is not a valid batch layout", st_path);
    return ER_OK;
}

int checkpoint_load(const char *dir, TrainState *st, float *params, size_t n, AdamW *opt) {
    memset(st, 0, sizeof *st);
    char *js_path = path_join(dir, STATE_JSON), *st_path = NULL;
    cJSON *j = NULL;
    StFile f = {0};
    long n_params = 0, adam_step = 0, n_batches = 0;
    const char *tensors = NULL;
    int rc = ER_OK;
    if (!js_path)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(json_parse_file(js_path, 1 << 26, &j));
    ER_CHECK(parse_state(j, js_path, st, &adam_step, &n_params, &n_batches, &tensors));
    if ((size_t)n_params != n)
        ER_CHECK(er_error(ER_EFORMAT, "%s: the checkpoint holds %ld parameters, this run trains %zu", js_path,
                          n_params, n));
    if (!(st_path = path_join(dir, tensors)))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(safetensors_open(&f, st_path));
    const char *meta_step = safetensors_meta(&f, "step");
    if (!meta_step || strtol(meta_step, NULL, 10) != st->step)
        ER_CHECK(er_error(ER_EFORMAT, "%s: written for step %s, but %s says step %ld", st_path,
                          meta_step ? meta_step : "?", js_path, st->step));
    if (opt->n != n)
        ER_CHECK(er_error(ER_EINVAL, "%s: optimizer sized for %zu parameters, not %zu", js_path, opt->n, n));
    ER_CHECK(load_tensor(&f, "params", DT_F32, n, params));
    ER_CHECK(load_tensor(&f, "adam.m", DT_F32, n, opt->m));
    ER_CHECK(load_tensor(&f, "adam.v", DT_F32, n, opt->v));
    opt->step = adam_step;
    if (n_batches > 0)
        ER_CHECK(load_data_order(&f, st_path, n_batches, st));
done:
    safetensors_close(&f);
    cJSON_Delete(j);
    er_free(js_path);
    er_free(st_path);
    if (rc < 0)
        train_state_free(st);
    return rc;
}
