// The public C API (infer/erinfer.h) over the engine.
#include "infer/erinfer.h"

#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "infer/api_struct.h"
#include "infer/decode_batch.h"
#include "infer/embed.h"
#include "infer/engine.h"
#include "infer/model_source.h"
#include "infer/pipeline.h"
#include "infer/runner.h"
#include "lora/peft.h"
#include "model/head.h"
#include "model/model.h"

// The public enums are the internal ones: a change on either side fails to compile here. This file
// includes infer/erinfer.h first, so the status enum in force is the public one.
#define ER_STATUS_SAME_(name, value, text) \
    _Static_assert(name == value, #name " in infer/erinfer.h differs from core/error.h's ER_STATUS_LIST");
ER_STATUS_LIST(ER_STATUS_SAME_)
#undef ER_STATUS_SAME_
#define ER_SAME_(pub, internal, where) _Static_assert((int)(pub) == (int)(internal), #pub " differs from " where);
ER_SAME_(ER_FINISH_EOS, FINISH_EOS, "infer/engine.h")
ER_SAME_(ER_FINISH_STOP, FINISH_STOP, "infer/engine.h")
ER_SAME_(ER_FINISH_LENGTH, FINISH_LENGTH, "infer/engine.h")
ER_SAME_(ER_ROUTE_DIRECT, ROUTE_DIRECT, "infer/pipeline.h")
ER_SAME_(ER_ROUTE_REASONING, ROUTE_REASONING, "infer/pipeline.h")
ER_SAME_(ER_STOP_MAX, STOP_MAX, "infer/stop.h")
ER_SAME_(ER_STOP_MAX_LEN, STOP_MAX_LEN, "infer/stop.h")
ER_SAME_(ER_TOP_LOGPROBS_MAX, ENGINE_TOP_MAX, "infer/engine.h")
ER_SAME_(ER_KV_F32, KV_F32, "model/kvcache.h")
ER_SAME_(ER_KV_INT8, KV_INT8, "model/kvcache.h")
ER_SAME_(ER_POOL_MEAN, EMBED_MEAN, "infer/embed.h")
ER_SAME_(ER_POOL_LAST, EMBED_LAST, "infer/embed.h")
#undef ER_SAME_
_Static_assert(sizeof(int32_t) == sizeof(int), "token ids cross the API as int32_t and are ints inside");

// The first version of each struct a caller fills: the end of its last field then. A struct's size may not be
// smaller; fields added later go after these and keep them valid (infer/erinfer.h, "Structs").
#define GEN_PARAMS_V1 (offsetof(ErGenParams, top_logprobs) + sizeof(int))
#define SESSION_PARAMS_V1 (offsetof(ErSessionParams, callbacks) + sizeof(const ErCallbacks *))
#define CALLBACKS_V1 (offsetof(ErCallbacks, abort) + sizeof(ErAbortCallback))
#define EMBED_PARAMS_V1 (offsetof(ErEmbedParams, query) + sizeof(int))

struct ErModel {
    atomic_int refs;    // the caller's (until er_model_free) and one per open session or batch: the last frees it
    atomic_int freed;   // er_model_free was called
    atomic_int running; // generate calls and batch requests running on it, or MODEL_CHANGING (see model_use_begin)
    Model model;
    Tokenizer *tok;
    ChatStyle style;
    LoraAdapter adapter;     // zeroed when none is loaded (mats NULL)
    // er_model_set_device: where the passes run (NULL: the CPU, on model and adapter), the model and the
    // adapter (when one is loaded) placed there
    Backend *be;
    Model placed;
    LoraAdapter placed_adapter;
    TrainedHead switcher, verifier; // likewise (net.params NULL)
    EmbedSpec embed;         // how er_embed pools and the query prompt, as the model dir or GGUF says
    unsigned heads_loaded;   // head loads so far: a session warns about a head's KV type once per load
    ErCallbacks cb;          // er_model_load_ex's (zeroed: none); its log serves sessions without their own
};

struct ErSession {
    ErModel *m;         // holds one of m->refs from er_session_open on
    atomic_int use;     // USE_* (see use_enter)
    int n_threads;      // its calls' thread count (threads_push)
    KvType kv;
    ErCallbacks cb;     // ErSessionParams.callbacks' copy (zeroed: none)
    unsigned heads_seen; // m->heads_loaded when it last checked the heads' KV type
    Engine engine;
    GenSample *samples; // (max_samples)
    ErSample *pub;      // (max_samples)
    int n;
    ErStats stats;
    PipelineResult pr;  // of the last pipeline call
    ErRoute route;
    int has_route;
    const char **vote_answers; // (max_samples) views into pr.votes
    double *vote_weights;
    int *vote_counts;
};

// What is loaded: an adapter or a head always has its buffers.
static const LoraAdapter *model_adapter(const ErModel *m) { return m->adapter.mats ? &m->adapter : NULL; }
// What the passes run: the model and adapter, or their copies where er_model_set_device placed them.
static Model *pass_model(ErModel *m) { return m->be ? &m->placed : &m->model; }
static const LoraAdapter *pass_adapter(const ErModel *m) {
    return !m->adapter.mats ? NULL : m->be ? &m->placed_adapter : &m->adapter;
}
// The memory a session's engine may take: on the device the model is placed on, or the machine's.
static size_t pass_memory(const ErModel *m) {
    size_t bytes = 0;
    return m->be && m->be->ops->mem_available(m->be, &bytes) == ER_OK ? bytes : er_physical_memory();
}
static const TrainedHead *model_switcher(const ErModel *m) { return m->switcher.net.params ? &m->switcher : NULL; }
static const TrainedHead *model_verifier(const ErModel *m) { return m->verifier.net.params ? &m->verifier : NULL; }
// A hybrid-thinking model (Qwen3's template): its thinking switch is the pipeline's two routes.
static int model_hybrid(const ErModel *m) { return chat_style_hybrid(m->style); }

// Public functions check their pointers first: a NULL is an error status, never a crash.
#define NEED(ptr, fn, what)                                                \
    do {                                                                   \
        if (!(ptr))                                                        \
            return er_error(ER_EINVAL, "%s: %s is NULL", fn, what);        \
    } while (0)
// A model given to er_model_free lives on for its sessions but takes nothing new.
#define NOT_FREED(m, fn)                                                   \
    do {                                                                   \
        if (atomic_load(&(m)->freed))                                      \
            return er_error(ER_EINVAL, "%s: the model was freed", fn);     \
    } while (0)

// One call at a time on a session or a batch: a call takes it from USE_IDLE to USE_BUSY and back. A
// second call meanwhile (from a token callback of the first, or from another thread) finds it in use
// and is refused; a *_free meanwhile (which cannot fail) marks it USE_FREE, and the running call stops
// calling callbacks and releases it on its way out. An atomic exchange per call: nothing waits.
enum { USE_IDLE = 0, USE_BUSY, USE_FREE };

static int use_enter(atomic_int *use) {
    int idle = USE_IDLE;
    return atomic_compare_exchange_strong(use, &idle, USE_BUSY);
}

// Ends a call: 1 when a free came during it (the caller releases the object now).
static int use_leave(atomic_int *use) {
    int busy = USE_BUSY;
    return !atomic_compare_exchange_strong(use, &busy, USE_IDLE);
}

// For a *_free: 1 when the object may be released now, 0 when the running call will (or already must).
static int use_free(atomic_int *use) {
    for (;;) {
        int v = USE_IDLE;
        if (atomic_compare_exchange_strong(use, &v, USE_BUSY))
            return 1;
        if (v == USE_FREE || atomic_compare_exchange_strong(use, &v, USE_FREE))
            return 0;
        // the call ended between the two exchanges: try again
    }
}

static int in_use(const char *fn, const char *what) {
    return er_error(ER_EINVAL, "%s: the %s is in use by another call (from its own token callback, or on another "
                    "thread): it takes one call at a time", fn, what);
}

// The model's parts (adapter, heads) are read by every running generation and replaced by a load: a
// generation holds m->running up by one while it runs, a load swaps its part in only while m->running
// is 0 (and holds it at MODEL_CHANGING meanwhile). Either side that finds the other refuses.
enum { MODEL_CHANGING = -1 };

static int model_use_begin(ErModel *m, const char *fn) {
    int v = atomic_load(&m->running);
    do {
        if (v < 0)
            return er_error(ER_EINVAL, "%s: the model is being changed by an er_model_load_* call on another thread",
                            fn);
    } while (!atomic_compare_exchange_weak(&m->running, &v, v + 1));
    return ER_OK;
}

static void model_use_end(ErModel *m) { atomic_fetch_sub(&m->running, 1); }

static int model_change_begin(ErModel *m, const char *fn) {
    int v = 0;
    if (atomic_compare_exchange_strong(&m->running, &v, MODEL_CHANGING))
        return ER_OK;
    if (v < 0)
        return er_error(ER_EINVAL, "%s: another er_model_load_* call is changing the model", fn);
    return er_error(ER_EINVAL, "%s: %d generations are running on the model's sessions or batches; load between "
                    "generations", fn, v);
}

static void model_change_end(ErModel *m) { atomic_store(&m->running, 0); }

const char *er_version(void) { return ER_VERSION_STRING; }

// ---- the structs a caller fills: size first (infer/erinfer.h, "Structs") ----

int api_struct_init(void *p, size_t size, const void *defaults, size_t known, size_t first, const char *fn) {
    NEED(p, fn, "the struct");
    if (size < first || size > known + API_STRUCT_SLACK_MAX)
        return er_error(ER_EINVAL, "%s: size %zu, expected %zu (this library's) or at least %zu (the struct's first "
                        "version) and at most %zu", fn, size, known, first, known + API_STRUCT_SLACK_MAX);
    memset(p, 0, size);
    memcpy(p, defaults, size < known ? size : known);
    memcpy(p, &size, sizeof size);
    return ER_OK;
}

int api_struct_read(void *dst, size_t known, const void *src, size_t first, const char *fn, const char *what) {
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size < first || size > known + API_STRUCT_SLACK_MAX)
        return er_error(ER_EINVAL, "%s: %s.size is %zu, expected %zu (or, from another version of infer/erinfer.h, "
                        "%zu..%zu): was it filled by its _init function?", fn, what, size, known, first,
                        known + API_STRUCT_SLACK_MAX);
    const unsigned char *b = src;
    for (size_t i = known; i < size; i++)
        if (b[i])
            return er_error(ER_EINVAL, "%s: %s.size is %zu and byte %zu is set, a field this library (erinfer %s, %zu "
                            "bytes) does not know: leave it zero or use a newer library", fn, what, size, i,
                            ER_VERSION_STRING, known);
    memcpy(dst, src, size < known ? size : known);
    memcpy(dst, &known, sizeof known);
    return ER_OK;
}

static const ErGenParams gen_defaults = {.size = sizeof(ErGenParams), .max_new_tokens = 256, .n_samples = 1,
                                         .top_p = 1.0f, .answer_tokens = 32};
static const ErSessionParams session_defaults = {.size = sizeof(ErSessionParams), .max_samples = 1,
                                                 .max_tokens = 2048, .kv_type = ER_KV_F32};
static const ErCallbacks callbacks_defaults = {.size = sizeof(ErCallbacks)};
static const ErEmbedParams embed_defaults = {.size = sizeof(ErEmbedParams), .normalize = 1};

int er_gen_params_init_size(ErGenParams *p, size_t size) {
    return api_struct_init(p, size, &gen_defaults, sizeof gen_defaults, GEN_PARAMS_V1, "er_gen_params_init_size");
}

int er_session_params_init_size(ErSessionParams *p, size_t size) {
    return api_struct_init(p, size, &session_defaults, sizeof session_defaults, SESSION_PARAMS_V1,
                       "er_session_params_init_size");
}

int er_embed_params_init_size(ErEmbedParams *p, size_t size) {
    return api_struct_init(p, size, &embed_defaults, sizeof embed_defaults, EMBED_PARAMS_V1,
                           "er_embed_params_init_size");
}

int er_callbacks_init_size(ErCallbacks *c, size_t size) {
    ErCallbacks d = callbacks_defaults; // (GCC 12 takes the constant's zeros for a string it reads past)
    return api_struct_init(c, size, &d, sizeof d, CALLBACKS_V1, "er_callbacks_init_size");
}

// The caller's ErGenParams (not NULL) into the library's version *q.
static int gen_params_read(ErGenParams *q, const ErGenParams *p, const char *fn) {
    *q = gen_defaults;
    return api_struct_read(q, sizeof *q, p, GEN_PARAMS_V1, fn, "ErGenParams");
}

// The caller's callbacks (NULL: none) into *out.
static int callbacks_read(ErCallbacks *out, const ErCallbacks *cb, const char *fn) {
    *out = (ErCallbacks){0};
    if (!cb)
        return ER_OK;
    *out = callbacks_defaults;
    return api_struct_read(out, sizeof *out, cb, CALLBACKS_V1, fn, "ErCallbacks");
}

// One line to the log callback: `own`'s (a session's or batch's) when it has one, else the model's.
__attribute__((format(printf, 4, 5))) static void api_log(const ErModel *m, const ErCallbacks *own, int level,
                                                          const char *fmt, ...) {
    const ErCallbacks *cb = own && own->log ? own : &m->cb;
    if (!cb->log)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cb->log(cb->user, level, line);
}

// The placed copies freed and the device closed: the passes run on the CPU again.
static void model_unplace(ErModel *m) {
    if (!m->be)
        return;
    if (m->placed_adapter.mats)
        lora_backend_free(&m->placed_adapter, m->be);
    model_free(&m->placed);
    backend_close(m->be);
    m->be = NULL;
    memset(&m->placed, 0, sizeof m->placed);
    memset(&m->placed_adapter, 0, sizeof m->placed_adapter);
}

static void model_release(ErModel *m) {
    model_unplace(m);
    trained_head_free(&m->switcher);
    trained_head_free(&m->verifier);
    lora_free(&m->adapter);
    model_free(&m->model);
    tok_free(m->tok);
    embed_spec_free(&m->embed);
    er_free(m);
}

// Drops one reference (the caller's, a session's or a batch's): the last one frees the model.
static void model_unref(ErModel *m) {
    if (atomic_fetch_sub(&m->refs, 1) == 1)
        model_release(m);
}

// A new model (one reference: the caller's) with its callbacks, or NULL.
static ErModel *model_new(const ErCallbacks *cbs) {
    ErModel *m = er_calloc(1, sizeof *m);
    if (m) {
        atomic_init(&m->refs, 1);
        m->cb = *cbs;
    }
    return m;
}

// The tokenizer fits the model's vocabulary.
static int model_check_vocab(const ErModel *m, const char *name) {
    if (tok_vocab_size(m->tok) > m->model.cfg.V)
        return er_error(ER_EFORMAT, "%s: the tokenizer has %d ids but the model only %d", name, tok_vocab_size(m->tok),
                        m->model.cfg.V);
    return ER_OK;
}

// A load's steps (ErCallbacks' progress and abort): the files (1), each matrix laid out for decode, the
// tokenizer and template (1).
typedef struct {
    const ErCallbacks *cb;
    const char *dir;
    long total;
} LoadSteps;

// Reports step `done` of the load; ER_EABORTED when the abort callback says stop.
static int load_step(LoadSteps *ls, long done) {
    const ErCallbacks *cb = ls->cb;
    if (cb->progress)
        cb->progress(cb->user, ER_PROGRESS_LOAD, done, ls->total);
    if (done < ls->total && cb->abort && cb->abort(cb->user))
        return er_error(ER_EABORTED, "er_model_load %s: stopped by the abort callback at step %ld of %ld", ls->dir,
                        done, ls->total);
    return ER_OK;
}

// model_tile_for_decode's step: matrix `done` of `total` is step 1 + done of the load.
static int load_tile_step(void *user, int done, int total) {
    (void)total;
    LoadSteps *ls = user;
    return load_step(ls, 1 + done) < 0; // model_open words the error
}

// The model's part of er_model_load_ex, on a zeroed m.
static int model_open(ErModel *m, const char *dir) {
    ER_TRY(model_load(&m->model, dir, 0));
    LoadSteps ls = {&m->cb, dir, 2};
    for (int i = 0; i < m->model.n_params; i++)
        ls.total += m->model.params[i].w != NULL;
    ER_TRY(load_step(&ls, 1));
    size_t tiled = 0;
    int rc = model_tile_for_decode(&m->model, &tiled, load_tile_step, &ls);
    if (rc == ER_EABORTED)
        return er_error(ER_EABORTED, "er_model_load %s: stopped by the abort callback while laying out the weights "
                        "for decode", dir);
    ER_TRY(rc);
    ER_TRY(tok_load(&m->tok, dir));
    ER_TRY(chat_style_from_config(dir, &m->style));
    ER_TRY(embed_spec_load(&m->embed, m->model.gguf ? NULL : dir, m->model.gguf));
    ER_TRY(model_check_vocab(m, dir));
    const ModelConfig *c = &m->model.cfg;
    ER_TRY(load_step(&ls, ls.total));
    api_log(m, NULL, ER_LOG_INFO, "loaded %s: %s, %d layers, hidden %d, %d heads (%d KV), vocabulary %d, %d positions, "
            "weights %s, chat template %s, %.1f MiB copied into the decode layout", dir,
            model_arch_name(c->arch), c->L, c->C, c->NH, c->NKV, c->V, c->max_pos,
            m->model.quant.enabled ? "quantized" : dtype_name(c->dtype), chat_style_name(m->style),
            tiled / 1048576.0);
    return ER_OK;
}

int er_model_load(ErModel **out, const char *dir) { return er_model_load_ex(out, dir, NULL); }

int er_model_load_ex(ErModel **out, const char *dir, const ErCallbacks *cb) {
    NEED(out, "er_model_load", "the output pointer");
    *out = NULL;
    NEED(dir, "er_model_load", "the model dir");
    ErCallbacks cbs;
    ER_TRY(callbacks_read(&cbs, cb, "er_model_load_ex"));
    ErModel *m = model_new(&cbs);
    if (!m)
        return ER_ENOMEM;
    int rc = model_open(m, dir);
    if (rc < 0) {
        er_model_free(m);
        return rc;
    }
    *out = m;
    return ER_OK;
}

// ---- loading from memory or a file descriptor ----

void er_model_source_init(ErModelSource *src) {
    if (!src)
        return;
    memset(src, 0, sizeof *src);
    src->size = sizeof *src;
}

// One ErBuffer of a source as a JSON text named after its field ("<config_json>"): NULL data means not given.
static int source_text(const ErBuffer *b, const char *field, const char *fn, JsonText *t) {
    *t = (JsonText){field, b->data, b->len};
    if (!b->data && b->len)
        return er_error(ER_EINVAL, "%s: ErModelSource.%.*s.data is NULL but its len is %zu", fn,
                        (int)strlen(field) - 2, field + 1, b->len);
    return ER_OK;
}

// src checked (NULL: no texts, the bytes copied) into texts and *borrow.
static int source_texts(const ErModelSource *src, const char *fn, ModelTexts *tx, int *borrow) {
    static const ErModelSource none = {sizeof none, 0, {NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    if (!src)
        src = &none;
    if (src->size != sizeof *src)
        return er_error(ER_EINVAL, "%s: ErModelSource.size is %zu but this library's is %zu: set it with "
                        "er_model_source_init (a header of another version?)", fn, src->size, sizeof *src);
    if (src->flags & ~(unsigned)ER_MODEL_SOURCE_BORROW)
        return er_error(ER_EINVAL, "%s: ErModelSource.flags 0x%x holds bits this library does not know", fn,
                        src->flags);
    *borrow = (src->flags & ER_MODEL_SOURCE_BORROW) != 0;
    ER_TRY(source_text(&src->config_json, "<config_json>", fn, &tx->config));
    ER_TRY(source_text(&src->tokenizer_json, "<tokenizer_json>", fn, &tx->tokenizer));
    ER_TRY(source_text(&src->tokenizer_config_json, "<tokenizer_config_json>", fn, &tx->tokenizer_config));
    return source_text(&src->generation_config_json, "<generation_config_json>", fn, &tx->generation_config);
}

// A model from bytes (taken over) and texts, without callbacks.
static int load_source(ErModel **out, ByteRange *bytes, const ModelTexts *tx) {
    char name[64];
    snprintf(name, sizeof name, "%s", bytes->name);
    const ErCallbacks none = {0};
    ErModel *m = model_new(&none);
    if (!m) {
        bytes_free(bytes);
        return ER_ENOMEM;
    }
    int rc = ER_OK;
    ER_CHECK(model_source_load(&m->model, &m->tok, &m->style, bytes, tx));
    ER_CHECK(embed_spec_load(&m->embed, NULL, m->model.gguf)); // no dir: a safetensors model pools by the mean
    ER_CHECK(model_check_vocab(m, name));
    ER_CHECK(model_tile_for_decode(&m->model, NULL, NULL, NULL));
    *out = m;
    return ER_OK;
done:
    er_model_free(m);
    return rc;
}

int er_model_load_from_buffer(ErModel **out, const void *data, size_t len, const ErModelSource *src) {
    const char *fn = "er_model_load_from_buffer";
    NEED(out, fn, "the output pointer");
    *out = NULL;
    NEED(data, fn, "the data");
    ModelTexts tx;
    ByteRange bytes;
    int borrow;
    ER_TRY(source_texts(src, fn, &tx, &borrow));
    ER_TRY(bytes_from_buffer(&bytes, data, len, "<buffer>", borrow));
    return load_source(out, &bytes, &tx);
}

int er_model_load_from_fd(ErModel **out, int fd, int64_t offset, int64_t length, const ErModelSource *src) {
    const char *fn = "er_model_load_from_fd";
    NEED(out, fn, "the output pointer");
    *out = NULL;
    if (offset < 0 || length < -1)
        return er_error(ER_EINVAL, "%s: fd %d: offset %lld, length %lld: the offset must be >= 0 and the length >= 0 "
                        "or -1 (to the end of the file)", fn, fd, (long long)offset, (long long)length);
    ModelTexts tx;
    ByteRange bytes;
    int borrow;
    ER_TRY(source_texts(src, fn, &tx, &borrow));
    ER_TRY(bytes_from_fd(&bytes, fd, (uint64_t)offset, length < 0 ? BYTES_TO_END : (uint64_t)length));
    return load_source(out, &bytes, &tx);
}

int er_model_load_adapter(ErModel *m, const char *dir) {
    const char *fn = "er_model_load_adapter";
    NEED(m, fn, "the model");
    NEED(dir, fn, "the adapter dir");
    NOT_FREED(m, fn);
    const ModelConfig *c = &m->model.cfg;
    LoraShape shape = model_config_lora_shape(c);
    LoraAdapter a, placed = {0};
    ER_TRY(peft_load(&a, dir, &shape, 0));
    int rc = model_change_begin(m, fn); // the old one may be in use until now; m->be holds while this does
    if (rc == ER_OK && m->be && (rc = lora_to_backend(&placed, &a, m->be)) < 0) {
        model_change_end(m);
        rc = er_error_prefix(rc, "%s", fn);
    }
    if (rc < 0) {
        lora_free(&a);
        return rc;
    }
    lora_free(&m->adapter);
    m->adapter = a;
    if (m->placed_adapter.mats)
        lora_backend_free(&m->placed_adapter, m->be);
    m->placed_adapter = placed;
    model_change_end(m);
    return ER_OK;
}

int er_model_set_device(ErModel *m, const char *device) {
    const char *fn = "er_model_set_device";
    NEED(m, fn, "the model");
    NEED(device, fn, "the device");
    NOT_FREED(m, fn);
    ER_TRY(model_change_begin(m, fn)); // no generation, session open or load meanwhile
    Backend *be = NULL;
    Model placed = {0};
    LoraAdapter placed_adapter = {0};
    int rc = ER_OK, open = atomic_load(&m->refs) - 1;
    if (open > 0)
        ER_CHECK(er_error(ER_EINVAL, "%s: %d sessions or batches are open on the model: set its device before opening "
                          "them", fn, open));
    if ((rc = backend_open(&be, device)) < 0 ||
        (be->kind != BACKEND_CPU && (rc = model_to_backend(&placed, &m->model, be)) < 0) ||
        (be->kind != BACKEND_CPU && m->adapter.mats && (rc = lora_to_backend(&placed_adapter, &m->adapter, be)) < 0))
        ER_CHECK(er_error_prefix(rc, "%s", fn));
    model_unplace(m);
    if (be->kind != BACKEND_CPU) {
        m->be = be, m->placed = placed, m->placed_adapter = placed_adapter;
        be = NULL;
        memset(&placed, 0, sizeof placed);
        memset(&placed_adapter, 0, sizeof placed_adapter);
    }
    api_log(m, NULL, ER_LOG_INFO, "passes run on %s (%s)", m->be ? m->be->name : "cpu",
            m->be ? m->be->device : backend_cpu()->device);
done:
    model_change_end(m);
    if (be && be->kind != BACKEND_CPU) {
        if (placed_adapter.mats)
            lora_backend_free(&placed_adapter, be);
        model_free(&placed);
        backend_close(be);
    }
    return rc;
}

static int load_head(ErModel *m, const char *path, HeadRole role) {
    const char *fn = role == HEAD_SWITCHER ? "er_model_load_switcher" : "er_model_load_verifier";
    NEED(m, fn, "the model");
    NEED(path, fn, "the head path");
    NOT_FREED(m, fn);
    TrainedHead *t = role == HEAD_SWITCHER ? &m->switcher : &m->verifier;
    TrainedHead h;
    ER_TRY(trained_head_load(&h, path, role, &m->model));
    int rc = model_change_begin(m, fn);
    if (rc < 0) {
        trained_head_free(&h);
        return rc;
    }
    trained_head_free(t);
    *t = h;
    m->heads_loaded++;
    model_change_end(m);
    return ER_OK;
}

int er_model_load_switcher(ErModel *m, const char *path) { return load_head(m, path, HEAD_SWITCHER); }
int er_model_load_verifier(ErModel *m, const char *path) { return load_head(m, path, HEAD_VERIFIER); }

void er_model_free(ErModel *m) {
    if (!m)
        return;
    atomic_store(&m->freed, 1);
    model_unref(m);
}

const Tokenizer *runner_model_tokenizer(const ErModel *m) { return m->tok; }

int er_model_max_positions(const ErModel *m) {
    NEED(m, "er_model_max_positions", "the model");
    return m->model.cfg.max_pos;
}

// The tokens of text (NULL: none), or a negative status.
static int count_tokens(const Tokenizer *tok, const char *text) {
    if (!text || !text[0])
        return 0;
    int *ids, n;
    ER_TRY(tok_encode(tok, text, strlen(text), &ids, &n));
    er_free(ids);
    return n;
}

const char *er_model_reasoning_prefix(const ErModel *m) {
    const LoraAdapter *ad = m ? model_adapter(m) : NULL;
    return ad ? ad->reasoning_prefix : NULL;
}

int er_model_extra_positions(const ErModel *m) {
    NEED(m, "er_model_extra_positions", "the model");
    ErModel *mu = (ErModel *)m; // reads the parts a load replaces: held like a generation's (no change seen)
    ER_TRY(model_use_begin(mu, "er_model_extra_positions"));
    const LoraAdapter *ad = model_adapter(m);
    const TrainedHead *vf = model_verifier(m);
    int prefix = ad ? count_tokens(m->tok, ad->reasoning_prefix) : 0;
    int verify = (ad || model_hybrid(m)) && vf ? count_tokens(m->tok, vf->verify_prompt) : 0;
    // A hybrid model's routes force its thinking switch: the longer of the two blocks.
    int off = model_hybrid(m) ? count_tokens(m->tok, CHAT_THINK_OFF) : 0;
    int on = model_hybrid(m) && !(ad && ad->reasoning_prefix) ? count_tokens(m->tok, CHAT_THINK_ON) : 0;
    model_use_end(mu);
    ER_TRY(prefix);
    ER_TRY(verify);
    ER_TRY(off);
    ER_TRY(on);
    prefix = prefix > on ? prefix : on;
    return (prefix > off ? prefix : off) + verify;
}

// ---- tokens and the chat template ----

// A text result the snprintf way: its first cap - 1 bytes and a NUL into out (cap > 0), its length returned.
static int text_out(const char *text, size_t len, char *out, size_t cap, const char *fn) {
    if (len > INT_MAX)
        return er_error(ER_ERANGE, "%s: the text has %zu bytes, more than an int can count", fn, len);
    if (cap > 0) {
        size_t n = len < cap - 1 ? len : cap - 1;
        memcpy(out, text, n);
        out[n] = 0;
    }
    return (int)len;
}

int er_tokenize(const ErModel *m, const char *text, int32_t *out, int cap, int parse_special) {
    NEED(m, "er_tokenize", "the model");
    NEED(text, "er_tokenize", "the text");
    NOT_FREED(m, "er_tokenize");
    if (cap < 0 || (cap > 0 && !out))
        return er_error(ER_EINVAL, "er_tokenize: cap is %d with %s output array (expected cap >= 0, and an array when "
                        "cap > 0)", cap, out ? "an" : "a NULL");
    int *ids, n;
    int rc = tok_encode_ex(m->tok, text, strlen(text), !parse_special, &ids, &n);
    if (rc < 0)
        return er_error_prefix(rc, "er_tokenize");
    if (n > 0 && cap > 0)
        memcpy(out, ids, sizeof(int) * (size_t)(n < cap ? n : cap));
    er_free(ids);
    return n;
}

int er_detokenize(const ErModel *m, const int32_t *tokens, int n, char *out, size_t cap) {
    NEED(m, "er_detokenize", "the model");
    NOT_FREED(m, "er_detokenize");
    if (n < 0 || (n > 0 && !tokens))
        return er_error(ER_EINVAL, "er_detokenize: %d tokens at %s (expected n >= 0, and an array when n > 0)", n,
                        tokens ? "an array" : "NULL");
    if (cap > 0 && !out)
        return er_error(ER_EINVAL, "er_detokenize: the output buffer is NULL but cap is %zu", cap);
    int V = tok_vocab_size(m->tok);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V || !tok_token_bytes(m->tok, tokens[i], &(size_t){0}))
            return er_error(ER_ERANGE, "er_detokenize: tokens[%d] is %d, not a token of the model's vocabulary (ids "
                            "0..%d)", i, (int)tokens[i], V - 1);
    char *text;
    size_t len;
    ER_TRY(tok_decode(m->tok, (const int *)tokens, n, &text, &len));
    int rc = text_out(text, len, out, cap, "er_detokenize");
    er_free(text);
    return rc;
}

int er_apply_template(const ErModel *m, const ErMessage *msgs, int n, int add_generation_prompt, char *out,
                      size_t cap) {
    NEED(m, "er_apply_template", "the model");
    NOT_FREED(m, "er_apply_template");
    if (n < 0 || (n > 0 && !msgs))
        return er_error(ER_EINVAL, "er_apply_template: %d messages at %s (expected n >= 0, and an array when n > 0)", n,
                        msgs ? "an array" : "NULL");
    if (cap > 0 && !out)
        return er_error(ER_EINVAL, "er_apply_template: the output buffer is NULL but cap is %zu", cap);
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return er_error(ER_EINVAL, "er_apply_template: message %d has a NULL %s", i,
                            msgs[i].role ? "content" : "role");
    ChatMessage *cm = er_calloc((size_t)(n > 0 ? n : 1), sizeof(ChatMessage));
    if (!cm)
        return ER_ENOMEM;
    for (int i = 0; i < n; i++)
        cm[i] = (ChatMessage){msgs[i].role, msgs[i].content};
    char *text = NULL;
    size_t len = 0;
    int rc = chat_render(m->style, cm, n, add_generation_prompt ? CHAT_ADD_GENERATION_PROMPT : 0, &text, &len);
    er_free(cm);
    if (rc < 0)
        return er_error_prefix(rc, "er_apply_template");
    rc = text_out(text, len, out, cap, "er_apply_template");
    er_free(text);
    return rc;
}

// What er_session_open and er_batch_open check: the pointers, and the parameters into *p (the library's
// version, callbacks copied into *cb) with room for at least 1 sample ("what") of 2 positions.
static int open_args(const void *out, const ErModel *m, const ErSessionParams *in, ErSessionParams *p,
                     ErCallbacks *cb, const char *fn, const char *what) {
    NEED(out, fn, "the output pointer");
    NEED(m, fn, "the model");
    NEED(in, fn, "the parameters (er_session_params_init fills the defaults)");
    NOT_FREED(m, fn);
    *p = session_defaults;
    ER_TRY(api_struct_read(p, sizeof *p, in, SESSION_PARAMS_V1, fn, "ErSessionParams"));
    ER_TRY(callbacks_read(cb, p->callbacks, fn));
    p->callbacks = NULL; // the copy in *cb serves
    if (p->max_samples < 1 || p->max_tokens < 2)
        return er_error(ER_EINVAL, "%s: need at least 1 %s and 2 positions (ErSessionParams.max_samples %d, "
                        "max_tokens %d)", fn, what, p->max_samples, p->max_tokens);
    if (p->kv_type != ER_KV_F32 && p->kv_type != ER_KV_INT8)
        return er_error(ER_EINVAL, "%s: ErSessionParams.kv_type is %d, expected ER_KV_F32 (0) or ER_KV_INT8 (1)", fn,
                        p->kv_type);
    if (p->n_threads < 0 || p->n_threads > ER_THREADS_MAX)
        return er_error(ER_EINVAL, "%s: ErSessionParams.n_threads is %d, expected 0 (the default) to %d", fn,
                        p->n_threads, ER_THREADS_MAX);
    if (p->n_threads == 0) // the opening thread's default, fixed now: the engine's scratch is sized for it
        p->n_threads = threads_get();
    return ER_OK;
}

// The engine's hooks into a session's or batch's callbacks (ErCallbacks *).
static int hook_abort(void *user) {
    const ErCallbacks *cb = user;
    return cb->abort && cb->abort(cb->user);
}

static void hook_progress(void *user, int done, int total) {
    const ErCallbacks *cb = user;
    if (cb->progress)
        cb->progress(cb->user, ER_PROGRESS_PREFILL, done, total);
}

int er_session_open(ErSession **out, ErModel *m, const ErSessionParams *params) {
    if (out)
        *out = NULL;
    ErSessionParams sp;
    ErCallbacks cb;
    ER_TRY(open_args(out, m, params, &sp, &cb, "er_session_open", "sample"));
    int rc = ER_OK;
    ErSession *s = er_calloc(1, sizeof *s);
    if (!s)
        return ER_ENOMEM;
    s->m = m;
    atomic_fetch_add(&m->refs, 1); // er_session_free gives it back, on this function's failure too
    s->n_threads = sp.n_threads;
    s->kv = sp.kv_type == ER_KV_INT8 ? KV_INT8 : KV_F32;
    s->cb = cb;
    // The KV cache and buffers are reserved now; a session that would not fit in memory is refused here. The
    // engine sizes its per-thread scratch with the thread count in force.
    ER_CHECK(model_use_begin(m, "er_session_open")); // reads where the model is placed
    int prev = threads_push(s->n_threads);
    rc = engine_init(&s->engine, pass_model(m), m->tok, s->kv, sp.max_samples, sp.max_tokens, 128, pass_memory(m));
    threads_pop(prev);
    model_use_end(m);
    if (rc < 0)
        ER_CHECK(er_error_prefix(rc, "er_session_open"));
    s->engine.hooks = (EngineHooks){hook_abort, hook_progress, &s->cb};
    s->samples = er_calloc((size_t)sp.max_samples, sizeof(GenSample));
    s->pub = er_calloc((size_t)sp.max_samples, sizeof(ErSample));
    s->vote_answers = er_calloc((size_t)sp.max_samples, sizeof(char *));
    s->vote_weights = er_calloc((size_t)sp.max_samples, sizeof(double));
    s->vote_counts = er_calloc((size_t)sp.max_samples, sizeof(int));
    if (!s->samples || !s->pub || !s->vote_answers || !s->vote_weights || !s->vote_counts)
        ER_CHECK(ER_ENOMEM);
    api_log(m, &s->cb, ER_LOG_INFO, "session: %d samples x %d positions, KV cache %s (%.1f MiB), %d threads",
            sp.max_samples, sp.max_tokens, s->kv == KV_INT8 ? "int8" : "f32",
            kv_cache_bytes(&m->model.cfg, s->kv, sp.max_samples + 1, (size_t)sp.max_samples * sp.max_tokens) /
                1048576.0,
            s->n_threads);
    *out = s;
    s = NULL;
done:
    er_session_free(s);
    return rc;
}

static void session_release(ErSession *s) {
    gen_samples_free(s->samples, s->n);
    pipeline_result_free(&s->pr);
    engine_free(&s->engine);
    er_free(s->samples);
    er_free(s->pub);
    er_free(s->vote_answers);
    er_free(s->vote_weights);
    er_free(s->vote_counts);
    ErModel *m = s->m;
    er_free(s);
    model_unref(m);
}

void er_session_free(ErSession *s) {
    if (s && use_free(&s->use))
        session_release(s);
}

// A generate call's hold on its session and the session's model; session_leave releases both (and the
// session when er_session_free came during the call).
static int session_enter(ErSession *s, const char *fn) {
    if (!use_enter(&s->use))
        return in_use(fn, "session");
    int rc = model_use_begin(s->m, fn);
    if (rc < 0 && use_leave(&s->use))
        session_release(s);
    return rc;
}

static void session_leave(ErSession *s) {
    model_use_end(s->m);
    if (use_leave(&s->use))
        session_release(s);
}

typedef struct {
    ErTokenCallback cb;
    void *user;
    const atomic_int *use;   // the session's or batch's: USE_FREE stops every sample
    const atomic_int *freed; // a request's (NULL in a session): set, its samples stop
} CbBridge;

// Once its session, batch or request has been freed (during the call) a callback is not called again.
static int bridge(void *user, int sample, int token, const char *bytes, size_t n) {
    (void)token;
    CbBridge *b = user;
    if (atomic_load(b->use) == USE_FREE || (b->freed && atomic_load(b->freed)))
        return 1;
    return b->cb(b->user, sample, bytes, n);
}

// The engine's configuration from the public parameters. The stop strings are checked here (the
// engine copies them per sample): a count outside 0..ER_STOP_MAX or a NULL entry is refused.
static int gen_config_from_params(const ErModel *m, const ErGenParams *p, GenConfig *g) {
    if (p->n_stop < 0 || p->n_stop > ER_STOP_MAX)
        return er_error(ER_EINVAL, "ErGenParams.n_stop is %d, expected 0..%d (ER_STOP_MAX)", p->n_stop, ER_STOP_MAX);
    if (p->n_stop > 0 && !p->stop)
        return er_error(ER_EINVAL, "ErGenParams.stop is NULL but n_stop is %d", p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i])
            return er_error(ER_EINVAL, "ErGenParams.stop[%d] is NULL (n_stop %d)", i, p->n_stop);
    gen_config_default(g);
    g->n_samples = p->n_samples;
    g->max_new = p->max_new_tokens;
    g->sampler.temperature = p->temperature;
    g->sampler.top_k = p->top_k;
    g->sampler.top_p = p->top_p;
    g->sampler.min_p = p->min_p;
    g->seed = p->seed;
    g->budget = p->budget;
    g->answer_tokens = p->answer_tokens;
    if (p->budget_suffix)
        g->budget_suffix = p->budget_suffix;
    g->adapter = pass_adapter(m);
    g->response_prefix = p->response_prefix ? p->response_prefix
                         : g->adapter       ? model_adapter(m)->reasoning_prefix
                                            : NULL;
    g->stop = p->stop;
    g->n_stop = p->n_stop;
    g->top_logprobs = p->top_logprobs;
    return ER_OK;
}

// With a head loaded, or a route forced with an adapter or on a hybrid model, a generate call runs the
// routed pipeline.
static int wants_pipeline(const ErModel *m, int force) {
    return model_switcher(m) || model_verifier(m) || (force != PIPELINE_AUTO && (model_adapter(m) || model_hybrid(m)));
}

static PipelineConfig pipeline_config(const ErModel *m, const GenConfig *g, int force) {
    PipelineConfig pc = {model_switcher(m), model_verifier(m), *g, *g, force, model_hybrid(m)};
    pc.direct.sampler.temperature = 0; // the base's direct answer is greedy, without a budget
    pc.direct.budget = 0;
    if (pc.hybrid && !pc.reasoning.response_prefix) // thinking on, forced as an adapter's prefix is
        pc.reasoning.response_prefix = CHAT_THINK_ON;
    return pc;
}

// A pipeline result as the public ErRoute (pointers into pr; the vote arrays hold pr->n entries) and
// its generation's stats as the call's: the prompt counts as the pipeline's prefill found it, and
// the first token comes after the switcher.
static void route_publish(const ErModel *m, const PipelineResult *pr, ErRoute *route, const char **vote_answers,
                          double *vote_weights, int *vote_counts, GenStats *st) {
    const TrainedHead *sw = model_switcher(m);
    *route = (ErRoute){pr->route, pr->switcher_score, sw ? sw->threshold : -1.0f, pr->verifier_scores,
                       (const char *const *)pr->answers, pr->n_votes, vote_answers, vote_weights, vote_counts,
                       pr->winner >= 0 ? pr->votes[pr->winner].answer : NULL, pr->prefill_s, pr->switcher_s,
                       pr->generate_s, pr->verify_s, pr->response_prefix};
    for (int k = 0; k < pr->n_votes; k++) {
        vote_answers[k] = pr->votes[k].answer;
        vote_weights[k] = pr->votes[k].weight;
        vote_counts[k] = pr->votes[k].count;
    }
    *st = pr->gen;
    // What neither prefill computed: the route's generation may prefill again (the direct answer of an
    // unmasked adapter's prompt), or reuse all of the pipeline's.
    st->prompt_reused = pr->prompt_reused < pr->gen.prompt_reused ? pr->prompt_reused : pr->gen.prompt_reused;
    st->ttft_s += pr->prefill_s + pr->switcher_s;
}

// A head fitted on another KV cache type than the one it runs on: its features, and so its threshold, shift a
// little. Said to the log once per head load (*seen: the loads already checked).
static void heads_kv_check(const ErModel *m, KvType kv, const ErCallbacks *own, unsigned *seen) {
    if (*seen == m->heads_loaded)
        return;
    *seen = m->heads_loaded;
    const TrainedHead *heads[2] = {model_switcher(m), model_verifier(m)};
    HeadKv run = kv == KV_INT8 ? HEAD_KV_INT8 : HEAD_KV_F32;
    for (int i = 0; i < 2; i++)
        if (heads[i] && heads[i]->kv != HEAD_KV_UNKNOWN && heads[i]->kv != run)
            api_log(m, own, ER_LOG_WARN, "the %s was fitted on %s KV cache features and runs here on %s: its threshold "
                    "may sit a little off; retrain it with ertrain heads --kv %s to match", i ? "verifier" : "switcher",
                    heads[i]->kv == HEAD_KV_INT8 ? "int8" : "f32", run == HEAD_KV_INT8 ? "int8" : "f32",
                    run == HEAD_KV_INT8 ? "int8" : "f32");
}

// The routed pipeline: its result becomes the session's ErRoute and stats.
static int generate_routed(ErSession *s, const int *ids, int n, const GenConfig *g, int force, CbBridge *b,
                           GenStats *st) {
    PipelineConfig pc = pipeline_config(s->m, g, force);
    heads_kv_check(s->m, s->kv, &s->cb, &s->heads_seen);
    ER_TRY(pipeline_run(&s->engine, ids, n, &pc, b->cb ? bridge : NULL, b, s->samples, &s->pr));
    s->n = s->pr.n;
    route_publish(s->m, &s->pr, &s->route, s->vote_answers, s->vote_weights, s->vote_counts, st);
    s->has_route = 1;
    return ER_OK;
}

// ErGenParams.route -> PIPELINE_*; "reasoning" needs an adapter or a hybrid-thinking model.
static int route_from_params(const ErModel *m, const ErGenParams *p, int *force) {
    const char *r = p->route;
    *force = !r || strcmp(r, "auto") == 0 ? PIPELINE_AUTO : strcmp(r, "direct") == 0 ? PIPELINE_DIRECT
           : strcmp(r, "reasoning") == 0 ? PIPELINE_REASONING : -1;
    if (*force < 0)
        return er_error(ER_EINVAL, "ErGenParams.route is \"%s\", expected auto, direct or reasoning", r);
    if (*force == PIPELINE_REASONING && !model_adapter(m) && !model_hybrid(m))
        return er_error(ER_EINVAL, "ErGenParams.route \"reasoning\" needs an adapter (none is loaded) or a "
                        "hybrid-thinking model (Qwen3's chat template; this one's is %s)", chat_style_name(m->style));
    return ER_OK;
}

// The public view of n samples and their stats (pointers into x).
static void results_publish(const GenSample *x, int n, const GenStats *st, double t0, ErSample *pub, ErStats *stats) {
    for (int i = 0; i < n; i++)
        pub[i] = (ErSample){x[i].text,     x[i].text_len,     x[i].tokens,       x[i].n_tokens,
                            (int)x[i].finish, x[i].budget_cut,   x[i].answer_at,    x[i].logprobs,
                            x[i].top_ids,  x[i].top_logprobs, x[i].n_top,     x[i].think_len};
    *stats = (ErStats){st->prompt_tokens, st->prompt_reused, st->generated_tokens, st->ttft_s,
                       st->decode_tokens_per_s, time_now() - t0, st->kv_bytes};
}

static int generate_ids(ErSession *s, const int *ids, int n, const ErGenParams *p, ErTokenCallback cb, void *user) {
    double t0 = time_now();
    // The last call's results go first: a failed call leaves none.
    gen_samples_free(s->samples, s->n);
    s->n = 0;
    pipeline_result_free(&s->pr);
    s->has_route = 0;
    GenConfig g;
    int force;
    ER_TRY(gen_config_from_params(s->m, p, &g));
    ER_TRY(route_from_params(s->m, p, &force));
    CbBridge b = {cb, user, &s->use, NULL};
    GenStats st;
    if (wants_pipeline(s->m, force)) {
        ER_TRY(generate_routed(s, ids, n, &g, force, &b, &st));
    } else {
        ER_TRY(engine_generate(&s->engine, ids, n, &g, cb ? bridge : NULL, &b, s->samples, &st));
        s->n = g.n_samples;
    }
    results_publish(s->samples, s->n, &st, t0, s->pub, &s->stats);
    return ER_OK;
}

// The text as is, the session held (session_enter).
static int generate_text(ErSession *s, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user) {
    int *ids, n;
    ER_TRY(tok_encode(s->m->tok, text, strlen(text), &ids, &n));
    int rc = generate_ids(s, ids, n, p, cb, user);
    er_free(ids);
    return rc;
}

// ---- embeddings ----

int er_model_embedding_size(const ErModel *m) {
    NEED(m, "er_model_embedding_size", "the model");
    return m->model.cfg.C;
}

const char *er_model_query_prompt(const ErModel *m) { return m ? m->embed.query_prompt : NULL; }

// Text i's tokens as HF's tokenizer(text) makes them: the template's tokens around the encoded text (with the
// query prompt first when asked).
static int embed_tokens(const ErModel *m, const char *prompt, const char *text, int **ids, int *n) {
    const int *pre, *post;
    int n_pre, n_post = tok_template(m->tok, &pre, &n_pre, &post), nt, rc = ER_OK;
    int *t = NULL;
    size_t np = prompt ? strlen(prompt) : 0, nx = strlen(text);
    char *joined = er_alloc(np + nx + 1);
    if (!joined)
        return ER_ENOMEM;
    memcpy(joined, prompt ? prompt : "", np);
    memcpy(joined + np, text, nx + 1);
    ER_CHECK(tok_encode(m->tok, joined, np + nx, &t, &nt));
    if (!(*ids = er_alloc(sizeof(int) * ((size_t)n_pre + nt + n_post + 1))))
        ER_CHECK(ER_ENOMEM);
    memcpy(*ids, pre, sizeof(int) * (size_t)n_pre);
    if (nt)
        memcpy(*ids + n_pre, t, sizeof(int) * (size_t)nt);
    memcpy(*ids + n_pre + nt, post, sizeof(int) * (size_t)n_post);
    *n = n_pre + nt + n_post;
done:
    er_free(t);
    er_free(joined);
    return rc;
}

static int embed_texts(ErSession *s, const char *const *texts, int n, const ErEmbedParams *p, float *out) {
    const ErModel *m = s->m;
    int C = m->model.cfg.C, dims = p->dimensions ? p->dimensions : C, pool = p->pooling, total = 0, rc = ER_OK;
    if (pool == ER_POOL_MODEL && m->embed.pooling == EMBED_UNSUPPORTED)
        return er_error(ER_EUNSUPPORTED, "er_embed: the model pools by %s; only mean and last-token pooling are "
                        "built (ErEmbedParams.pooling can ask for one)", m->embed.mode);
    int last = (pool == ER_POOL_MODEL ? (int)m->embed.pooling : pool) == ER_POOL_LAST;
    const char *prompt = p->query ? m->embed.query_prompt : NULL;
    if (p->query && !prompt)
        return er_error(ER_EINVAL, "er_embed: ErEmbedParams.query is set but the model has no query prompt "
                        "(config_sentence_transformers.json's prompts.query)");
    float *h = er_alloc(sizeof(float) * (size_t)C);
    if (!h)
        return ER_ENOMEM;
    for (int i = 0; i < n; i++) {
        int *ids = NULL, nt = 0;
        ER_CHECK(embed_tokens(m, prompt, texts[i], &ids, &nt));
        if (nt < 1 || nt > s->engine.max_len) {
            er_free(ids);
            ER_CHECK(er_error(ER_ERANGE, "er_embed: text %d is %d tokens, the session holds 1..%d (max_tokens)", i, nt,
                              s->engine.max_len));
        }
        rc = engine_embed(&s->engine, ids, nt, last, h);
        er_free(ids);
        ER_CHECK(rc);
        embed_finish(out + (size_t)i * dims, h, dims, p->normalize);
        total += nt;
    }
    rc = total;
done:
    er_free(h);
    return rc;
}

int er_embed(ErSession *s, const char *const *texts, int n, const ErEmbedParams *p, float *out, size_t cap) {
    NEED(s, "er_embed", "the session");
    NEED(texts, "er_embed", "the texts");
    NEED(p, "er_embed", "the parameters (er_embed_params_init fills the defaults)");
    NEED(out, "er_embed", "the output");
    ErEmbedParams q = embed_defaults;
    ER_TRY(api_struct_read(&q, sizeof q, p, EMBED_PARAMS_V1, "er_embed", "ErEmbedParams"));
    int C = s->m->model.cfg.C, dims = q.dimensions ? q.dimensions : C;
    if (n < 0)
        return er_error(ER_EINVAL, "er_embed: %d texts", n);
    for (int i = 0; i < n; i++)
        if (!texts[i])
            return er_error(ER_EINVAL, "er_embed: text %d is NULL", i);
    if (q.pooling < ER_POOL_MODEL || q.pooling > ER_POOL_LAST)
        return er_error(ER_EINVAL, "er_embed: ErEmbedParams.pooling is %d (expected ER_POOL_MODEL, _MEAN or _LAST)",
                        q.pooling);
    if (q.dimensions < 0 || q.dimensions > C)
        return er_error(ER_EINVAL, "er_embed: ErEmbedParams.dimensions is %d, the model's embeddings have 1..%d",
                        q.dimensions, C);
    if ((size_t)n * dims > cap)
        return er_error(ER_EINVAL, "er_embed: %d texts of %d values need %zu floats, the output holds %zu", n, dims,
                        (size_t)n * dims, cap);
    ER_TRY(session_enter(s, "er_embed"));
    int prev = threads_push(s->n_threads);
    int rc = embed_texts(s, texts, n, &q, out);
    threads_pop(prev);
    session_leave(s);
    return rc;
}

int er_generate_raw(ErSession *s, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user) {
    NEED(s, "er_generate_raw", "the session");
    NEED(text, "er_generate_raw", "the text");
    NEED(p, "er_generate_raw", "the parameters (er_gen_params_init fills the defaults)");
    ErGenParams q;
    ER_TRY(gen_params_read(&q, p, "er_generate_raw"));
    ER_TRY(session_enter(s, "er_generate_raw"));
    int prev = threads_push(s->n_threads);
    int rc = generate_text(s, text, &q, cb, user);
    threads_pop(prev);
    session_leave(s);
    return rc;
}

int er_generate(ErSession *s, const ErMessage *msgs, int n_msgs, const ErGenParams *p, ErTokenCallback cb,
                void *user) {
    NEED(s, "er_generate", "the session");
    NEED(msgs, "er_generate", "the messages");
    NEED(p, "er_generate", "the parameters (er_gen_params_init fills the defaults)");
    if (n_msgs < 1)
        return er_error(ER_EINVAL, "er_generate: no messages (n_msgs = %d)", n_msgs);
    for (int i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content)
            return er_error(ER_EINVAL, "er_generate: message %d has a NULL %s", i, msgs[i].role ? "content" : "role");
    ErGenParams q;
    ER_TRY(gen_params_read(&q, p, "er_generate"));
    ER_TRY(session_enter(s, "er_generate"));
    int rc = ER_OK, prev = threads_push(s->n_threads);
    char *text = NULL;
    ChatMessage *cm = er_calloc((size_t)n_msgs, sizeof(ChatMessage));
    if (!cm)
        ER_CHECK(ER_ENOMEM);
    for (int i = 0; i < n_msgs; i++)
        cm[i] = (ChatMessage){msgs[i].role, msgs[i].content};
    ER_CHECK(chat_render(s->m->style, cm, n_msgs, CHAT_ADD_GENERATION_PROMPT, &text, NULL));
    ER_CHECK(generate_text(s, text, &q, cb, user));
done:
    threads_pop(prev);
    er_free(cm);
    er_free(text);
    session_leave(s);
    return rc;
}

int er_result_count(const ErSession *s) {
    NEED(s, "er_result_count", "the session");
    return s->n;
}
const ErSample *er_result_sample(const ErSession *s, int i) { return s && i >= 0 && i < s->n ? &s->pub[i] : NULL; }
const ErStats *er_result_stats(const ErSession *s) { return s ? &s->stats : NULL; }
const ErRoute *er_result_route(const ErSession *s) { return s && s->has_route ? &s->route : NULL; }

// ---- several requests decoded together ----

struct ErBatch {
    ErModel *m;        // holds one of m->refs, as a session does
    atomic_int use;    // USE_* (see use_enter): a call on the batch, or on one of its live requests
    DecodeBatch batch;
    ErRequest **live;  // (max_rows) submitted, not done
    int n_live;
    int n_threads;     // as a session's
    KvType kv;
    ErCallbacks cb;
    unsigned heads_seen;
};

// A request is the caller's until er_request_free, whatever becomes of its batch: the batch only ever
// holds its live requests (b->live), and lets go of each when it finishes, is stopped, or the batch is
// freed (then it fails). Each also holds one of m->running while it is live.
struct ErRequest {
    ErBatch *b;        // while live; NULL once done (or stopped)
    atomic_int freed;  // er_request_free came during a call on its batch: the batch frees it after that call
    EngineRequest *er;
    CbBridge bridge;
    GenSample *samples; // (n)
    ErSample *pub;      // (n) once done; while decoding, er_request_progress's views
    int n, status;      // status: 1 decoding, then the outcome (n: the route's samples once done)
    double t0;
    ErStats stats;
    int routed;         // the routed pipeline: pc, pr and route below
    PipelineConfig pc;
    PipelineResult pr;
    ErRoute route;
    const char **vote_answers; // (n) views into pr.votes
    double *vote_weights;
    int *vote_counts;
};

int er_batch_open(ErBatch **out, ErModel *m, const ErSessionParams *params) {
    if (out)
        *out = NULL;
    ErSessionParams sp;
    ErCallbacks cb;
    ER_TRY(open_args(out, m, params, &sp, &cb, "er_batch_open", "row"));
    int max_rows = sp.max_samples;
    ErBatch *b = er_calloc(1, sizeof *b);
    if (!b)
        return ER_ENOMEM;
    int rc = ER_OK, held = 0;
    b->m = m;
    atomic_fetch_add(&m->refs, 1);
    b->n_threads = sp.n_threads;
    b->kv = sp.kv_type == ER_KV_INT8 ? KV_INT8 : KV_F32;
    b->cb = cb;
    ER_CHECK(model_use_begin(m, "er_batch_open")); // reads which adapter is loaded
    held = 1;
    int prev = threads_push(b->n_threads); // the engine's scratch is sized for the batch's thread count
    rc = decode_batch_init(&b->batch, pass_model(m), m->tok, pass_adapter(m), b->kv, max_rows, max_rows, sp.max_tokens,
                           128, pass_memory(m));
    threads_pop(prev);
    if (rc < 0)
        ER_CHECK(er_error_prefix(rc, "er_batch_open"));
    b->batch.e.hooks = (EngineHooks){hook_abort, hook_progress, &b->cb};
    api_log(m, &b->cb, ER_LOG_INFO, "batch: %d rows x %d positions, KV cache %s, %d threads", max_rows, sp.max_tokens,
            b->kv == KV_INT8 ? "int8" : "f32", b->n_threads);
    b->live = er_calloc((size_t)max_rows, sizeof *b->live);
    if (!b->live)
        ER_CHECK(ER_ENOMEM);
    *out = b;
    b = NULL;
done:
    if (held)
        model_use_end(m);
    er_batch_free(b);
    return rc;
}

// A request's buffers (its samples' texts are freed apart).
static void request_destroy(ErRequest *r) {
    if (!r)
        return;
    pipeline_result_free(&r->pr);
    er_free(r->samples);
    er_free(r->pub);
    er_free(r->vote_answers);
    er_free(r->vote_weights);
    er_free(r->vote_counts);
    er_free(r);
}

// The request and its results.
static void request_release(ErRequest *r) {
    gen_samples_free(r->samples, r->status == ER_OK ? r->n : 0);
    request_destroy(r);
}

// The request leaves the batch: texts and stats, or its failure.
static void request_finish(ErRequest *r) {
    ErBatch *b = r->b;
    GenStats st;
    if (r->routed && engine_request_done(r->er)) {
        r->status = decode_batch_end_routed(&b->batch, r->er, &r->pc, r->samples, &r->pr);
        if (r->status == ER_OK) {
            r->n = r->pr.n;
            route_publish(b->m, &r->pr, &r->route, r->vote_answers, r->vote_weights, r->vote_counts, &st);
        }
    } else { // a plain request, or a routed one abandoned while decoding (no verifier pass, no vote)
        r->n = engine_request_samples(r->er);
        r->status = decode_batch_end(&b->batch, r->er, &st);
        r->routed = 0;
    }
    r->er = NULL;
    r->b = NULL;
    for (int k = 0; k < b->n_live; k++)
        if (b->live[k] == r)
            b->live[k] = b->live[--b->n_live];
    model_use_end(b->m);
    if (r->status == ER_OK)
        results_publish(r->samples, r->n, &st, r->t0, r->pub, &r->stats);
}

// A live request stopped before it is done (freed, or its batch freed): it leaves the batch and
// fails, without results (its rows go back; a routed one gets no verifier pass, no vote).
static void request_stop(ErRequest *r) {
    DecodeBatch *db = &r->b->batch;
    int routed = r->routed;
    r->routed = 0;
    request_finish(r);
    if (routed) // one done in the step that stopped it kept its samples' KV for the verifier: not needed now
        engine_release_samples(&db->e);
    gen_samples_free(r->samples, r->status == ER_OK ? r->n : 0);
    r->status = ER_EINVAL;
    r->n = 0;
}

// The batch and its KV cache. Its live requests are stopped: one the caller freed during a call on the
// batch goes with it, the others stay the caller's to free.
static void batch_release(ErBatch *b) {
    while (b->n_live > 0) {
        ErRequest *r = b->live[0];
        request_stop(r);
        if (atomic_load(&r->freed))
            request_release(r);
    }
    decode_batch_free(&b->batch);
    er_free(b->live);
    ErModel *m = b->m;
    er_free(b);
    model_unref(m);
}

void er_batch_free(ErBatch *b) {
    if (b && use_free(&b->use))
        batch_release(b);
}

// Ends a call on the batch; released here when er_batch_free came during it. 1 when it was.
static int batch_leave(ErBatch *b) {
    if (!use_leave(&b->use))
        return 0;
    batch_release(b);
    return 1;
}

int er_batch_free_rows(const ErBatch *b) {
    NEED(b, "er_batch_free_rows", "the batch");
    return b->batch.max_rows - decode_batch_rows(&b->batch);
}

// er_batch_submit with the batch held: on success the request holds one of the model's running
// generations until it leaves the batch.
static int batch_submit(ErBatch *b, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user,
                        ErRequest **out) {
    GenConfig g;
    int force, rc = ER_OK, *ids = NULL, n = 0;
    ER_TRY(model_use_begin(b->m, "er_batch_submit"));
    ErRequest *r = NULL;
    ER_CHECK(gen_config_from_params(b->m, p, &g));
    ER_CHECK(route_from_params(b->m, p, &force));
    if (g.n_samples < 1 || g.n_samples > er_batch_free_rows(b))
        ER_CHECK(er_error(ER_ERANGE, "er_batch_submit: %d samples asked, %d rows free", g.n_samples,
                          er_batch_free_rows(b)));
    r = er_calloc(1, sizeof *r);
    if (!r)
        ER_CHECK(ER_ENOMEM);
    r->t0 = time_now();
    r->n = g.n_samples;
    r->bridge = (CbBridge){cb, user, &b->use, &r->freed};
    r->samples = er_calloc((size_t)r->n, sizeof *r->samples);
    r->pub = er_calloc((size_t)r->n, sizeof *r->pub);
    r->vote_answers = er_calloc((size_t)r->n, sizeof *r->vote_answers);
    r->vote_weights = er_calloc((size_t)r->n, sizeof *r->vote_weights);
    r->vote_counts = er_calloc((size_t)r->n, sizeof *r->vote_counts);
    if (!r->samples || !r->pub || !r->vote_answers || !r->vote_weights || !r->vote_counts)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(tok_encode(b->m->tok, text, strlen(text), &ids, &n));
    r->routed = wants_pipeline(b->m, force);
    if (r->routed)
        heads_kv_check(b->m, b->kv, &b->cb, &b->heads_seen);
    r->pc = pipeline_config(b->m, &g, force);
    // The config's strings (stop, budget suffix, prefix) are read at admission; its heads and adapter
    // are the model's, which outlives the batch and keeps them while the request runs.
    if (r->routed)
        ER_CHECK(decode_batch_add_routed(&b->batch, ids, n, &r->pc, &r->pr, cb ? bridge : NULL, &r->bridge,
                                         r->samples, &r->er));
    else
        ER_CHECK(decode_batch_add(&b->batch, ids, n, &g, cb ? bridge : NULL, &r->bridge, r->samples, &r->er));
    r->b = b;
    r->status = 1;
    b->live[b->n_live++] = r;
    *out = r;
    r = NULL;
done:
    if (rc < 0)
        model_use_end(b->m);
    er_free(ids);
    request_destroy(r);
    return rc;
}

int er_batch_submit(ErBatch *b, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user,
                    ErRequest **out) {
    NEED(out, "er_batch_submit", "the output pointer");
    *out = NULL;
    NEED(b, "er_batch_submit", "the batch");
    NEED(text, "er_batch_submit", "the text");
    NEED(p, "er_batch_submit", "the parameters (er_gen_params_init fills the defaults)");
    ErGenParams q;
    ER_TRY(gen_params_read(&q, p, "er_batch_submit"));
    if (!use_enter(&b->use))
        return in_use("er_batch_submit", "batch");
    int prev = threads_push(b->n_threads);
    int rc = batch_submit(b, text, &q, cb, user, out);
    threads_pop(prev);
    if (batch_leave(b) && rc == ER_OK) { // er_batch_free came meanwhile (another thread): the request failed with it
        request_release(*out);
        *out = NULL;
        rc = er_error(ER_EINVAL, "er_batch_submit: the batch was freed during the call");
    }
    return rc;
}

int er_batch_step(ErBatch *b) {
    NEED(b, "er_batch_step", "the batch");
    if (!use_enter(&b->use))
        return in_use("er_batch_step", "batch");
    int prev = threads_push(b->n_threads);
    decode_batch_step(&b->batch);
    // er_batch_free during the step (a callback): batch_leave stops every request, none of which was done
    // when it was called (the callbacks it cut short only make them look done).
    int freeing = atomic_load(&b->use) == USE_FREE;
    for (int k = b->n_live - 1; k >= 0 && !freeing; k--) { // request_finish moves the last entry into k
        ErRequest *r = b->live[k];
        if (atomic_load(&r->freed)) { // er_request_free came during the step (a callback): done now
            request_stop(r);
            request_release(r);
        } else if (engine_request_done(r->er)) {
            request_finish(r);
        }
    }
    int left = b->n_live;
    threads_pop(prev);
    return batch_leave(b) ? 0 : left;
}

int er_request_status(const ErRequest *r) {
    NEED(r, "er_request_status", "the request");
    return r->status;
}
int er_request_count(const ErRequest *r) {
    NEED(r, "er_request_count", "the request");
    return r->status == ER_OK ? r->n : 0;
}
const ErSample *er_request_sample(const ErRequest *r, int i) {
    return r && r->status == ER_OK && i >= 0 && i < r->n ? &r->pub[i] : NULL;
}
const ErSample *er_request_progress(const ErRequest *r, int i) {
    if (!r || r->status != 1 || i < 0 || i >= r->n)
        return NULL;
    const GenSample *x = &r->samples[i];
    r->pub[i] = (ErSample){NULL, 0, x->tokens, x->n_tokens, 0, 0, -1, x->logprobs, x->top_ids, x->top_logprobs,
                           x->n_top, x->think_len};
    return &r->pub[i];
}
const ErStats *er_request_stats(const ErRequest *r) { return r && r->status == ER_OK ? &r->stats : NULL; }
const ErRoute *er_request_route(const ErRequest *r) { return r && r->status == ER_OK && r->routed ? &r->route : NULL; }

void er_request_free(ErRequest *r) {
    if (!r)
        return;
    ErBatch *b = r->b;
    if (b) { // still live: it leaves the batch first (its rows go back)
        if (!use_enter(&b->use)) { // a call on the batch is running (this is its callback): it frees r
            atomic_store(&r->freed, 1);
            return;
        }
        if (r->b) // (not finished meanwhile by a step on another thread, a misuse)
            request_stop(r);
        batch_leave(b);
    }
    request_release(r);
}
