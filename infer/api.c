// The public C API (infer/erinfer.h) over the engine.
#include "infer/erinfer.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/progress.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "infer/decode_batch.h"
#include "infer/engine.h"
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
#undef ER_SAME_

struct ErModel {
    int sessions;  // open sessions: they keep the model alive (er_model_free waits for the last one)
    int freed;     // er_model_free was called
    Model model;
    Tokenizer *tok;
    ChatStyle style;
    LoraAdapter adapter;     // zeroed when none is loaded (mats NULL)
    TrainedHead switcher, verifier; // likewise (net.params NULL)
};

struct ErSession {
    ErModel *m;         // holds one of m->sessions from er_session_open on
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
static const TrainedHead *model_switcher(const ErModel *m) { return m->switcher.net.params ? &m->switcher : NULL; }
static const TrainedHead *model_verifier(const ErModel *m) { return m->verifier.net.params ? &m->verifier : NULL; }

// Public functions check their pointers first: a NULL is an error status, never a crash.
#define NEED(ptr, fn, what)                                                \
    do {                                                                   \
        if (!(ptr))                                                        \
            return er_error(ER_EINVAL, "%s: %s is NULL", fn, what);        \
    } while (0)
// A model given to er_model_free lives on for its sessions but takes nothing new.
#define NOT_FREED(m, fn)                                                   \
    do {                                                                   \
        if ((m)->freed)                                                    \
            return er_error(ER_EINVAL, "%s: the model was freed", fn);     \
    } while (0)

const char *er_version(void) { return ER_VERSION_STRING; }

void er_gen_params_init(ErGenParams *p) {
    if (!p)
        return;
    *p = (ErGenParams){.max_new_tokens = 256, .n_samples = 1, .top_p = 1.0f, .answer_tokens = 32};
}

static void model_release(ErModel *m) {
    trained_head_free(&m->switcher);
    trained_head_free(&m->verifier);
    lora_free(&m->adapter);
    model_free(&m->model);
    tok_free(m->tok);
    er_free(m);
}

int er_model_load(ErModel **out, const char *dir) {
    NEED(out, "er_model_load", "the output pointer");
    *out = NULL;
    NEED(dir, "er_model_load", "the model dir");
    int rc = ER_OK;
    ErModel *m = er_calloc(1, sizeof *m);
    if (!m)
        return ER_ENOMEM;
    ER_CHECK(model_load(&m->model, dir, 0));
    ER_CHECK(model_tile_for_decode(&m->model, NULL));
    ER_CHECK(tok_load(&m->tok, dir));
    ER_CHECK(chat_style_from_config(dir, &m->style));
    if (tok_vocab_size(m->tok) > m->model.cfg.V)
        ER_CHECK(er_error(ER_EFORMAT, "%s: the tokenizer has %d ids but the model only %d", dir,
                          tok_vocab_size(m->tok), m->model.cfg.V));
    *out = m;
    m = NULL;
done:
    er_model_free(m);
    return rc;
}

int er_model_load_adapter(ErModel *m, const char *dir) {
    NEED(m, "er_model_load_adapter", "the model");
    NEED(dir, "er_model_load_adapter", "the adapter dir");
    NOT_FREED(m, "er_model_load_adapter");
    const ModelConfig *c = &m->model.cfg;
    LoraShape shape = model_config_lora_shape(c);
    LoraAdapter a;
    ER_TRY(peft_load(&a, dir, &shape, 0));
    lora_free(&m->adapter);
    m->adapter = a;
    return ER_OK;
}

static int load_head(ErModel *m, const char *path, HeadRole role) {
    const char *fn = role == HEAD_SWITCHER ? "er_model_load_switcher" : "er_model_load_verifier";
    NEED(m, fn, "the model");
    NEED(path, fn, "the head path");
    NOT_FREED(m, fn);
    TrainedHead *t = role == HEAD_SWITCHER ? &m->switcher : &m->verifier;
    TrainedHead h;
    ER_TRY(trained_head_load(&h, path, role, &m->model));
    trained_head_free(t);
    *t = h;
    return ER_OK;
}

int er_model_load_switcher(ErModel *m, const char *path) { return load_head(m, path, HEAD_SWITCHER); }
int er_model_load_verifier(ErModel *m, const char *path) { return load_head(m, path, HEAD_VERIFIER); }

void er_model_free(ErModel *m) {
    if (!m)
        return;
    m->freed = 1;
    if (m->sessions == 0)
        model_release(m);
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

int er_model_extra_positions(const ErModel *m) {
    NEED(m, "er_model_extra_positions", "the model");
    const LoraAdapter *ad = model_adapter(m);
    const TrainedHead *vf = model_verifier(m);
    int prefix = ad ? count_tokens(m->tok, ad->reasoning_prefix) : 0;
    int verify = ad && vf ? count_tokens(m->tok, vf->verify_prompt) : 0;
    ER_TRY(prefix);
    ER_TRY(verify);
    return prefix + verify;
}

// What er_session_open and er_batch_open check: room for n samples ("what") of max_tokens positions.
static int open_args(const void *out, const ErModel *m, int n, int max_tokens, const char *fn, const char *what) {
    NEED(out, fn, "the output pointer");
    NEED(m, fn, "the model");
    NOT_FREED(m, fn);
    if (n < 1 || max_tokens < 2)
        return er_error(ER_EINVAL, "%s: need at least 1 %s and 2 positions (got %d, %d)", fn, what, n, max_tokens);
    return ER_OK;
}

int er_session_open(ErSession **out, ErModel *m, int max_samples, int max_tokens, int kv_int8) {
    if (out)
        *out = NULL;
    ER_TRY(open_args(out, m, max_samples, max_tokens, "er_session_open", "sample"));
    int rc = ER_OK;
    ErSession *s = er_calloc(1, sizeof *s);
    if (!s)
        return ER_ENOMEM;
    s->m = m;
    m->sessions++; // er_session_free gives it back, on this function's failure too
    // The KV cache and buffers are reserved now; a session that would not fit in memory is refused here.
    rc = engine_init(&s->engine, &m->model, m->tok, kv_int8 ? KV_INT8 : KV_F32, max_samples, max_tokens, 128,
                     er_physical_memory());
    if (rc < 0)
        ER_CHECK(er_error_prefix(rc, "er_session_open"));
    s->samples = er_calloc((size_t)max_samples, sizeof(GenSample));
    s->pub = er_calloc((size_t)max_samples, sizeof(ErSample));
    s->vote_answers = er_calloc((size_t)max_samples, sizeof(char *));
    s->vote_weights = er_calloc((size_t)max_samples, sizeof(double));
    s->vote_counts = er_calloc((size_t)max_samples, sizeof(int));
    if (!s->samples || !s->pub || !s->vote_answers || !s->vote_weights || !s->vote_counts)
        ER_CHECK(ER_ENOMEM);
    *out = s;
    s = NULL;
done:
    er_session_free(s);
    return rc;
}

void er_session_free(ErSession *s) {
    if (!s)
        return;
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
    if (--m->sessions == 0 && m->freed)
        model_release(m);
}

typedef struct {
    ErTokenCallback cb;
    void *user;
} CbBridge;

static int bridge(void *user, int sample, int token, const char *bytes, size_t n) {
    (void)token;
    CbBridge *b = user;
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
    g->adapter = model_adapter(m);
    g->response_prefix = p->response_prefix ? p->response_prefix : g->adapter ? g->adapter->reasoning_prefix : NULL;
    g->stop = p->stop;
    g->n_stop = p->n_stop;
    return ER_OK;
}

// With a head loaded, or a route forced with an adapter, a generate call runs the routed pipeline.
static int wants_pipeline(const ErModel *m, int force) {
    return model_switcher(m) || model_verifier(m) || (force != PIPELINE_AUTO && model_adapter(m));
}

static PipelineConfig pipeline_config(const ErModel *m, const GenConfig *g, int force) {
    PipelineConfig pc = {model_switcher(m), model_verifier(m), *g, *g, force};
    pc.direct.sampler.temperature = 0; // the base's direct answer is greedy, without a budget
    pc.direct.budget = 0;
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
                       pr->generate_s, pr->verify_s};
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

// The routed pipeline: its result becomes the session's ErRoute and stats.
static int generate_routed(ErSession *s, const int *ids, int n, const GenConfig *g, int force, CbBridge *b,
                           GenStats *st) {
    PipelineConfig pc = pipeline_config(s->m, g, force);
    ER_TRY(pipeline_run(&s->engine, ids, n, &pc, b->cb ? bridge : NULL, b, s->samples, &s->pr));
    s->n = s->pr.n;
    route_publish(s->m, &s->pr, &s->route, s->vote_answers, s->vote_weights, s->vote_counts, st);
    s->has_route = 1;
    return ER_OK;
}

// ErGenParams.route -> PIPELINE_*; "reasoning" needs an adapter.
static int route_from_params(const ErModel *m, const ErGenParams *p, int *force) {
    const char *r = p->route;
    *force = !r || strcmp(r, "auto") == 0 ? PIPELINE_AUTO : strcmp(r, "direct") == 0 ? PIPELINE_DIRECT
           : strcmp(r, "reasoning") == 0 ? PIPELINE_REASONING : -1;
    if (*force < 0)
        return er_error(ER_EINVAL, "ErGenParams.route is \"%s\", expected auto, direct or reasoning", r);
    if (*force == PIPELINE_REASONING && !model_adapter(m))
        return er_error(ER_EINVAL, "ErGenParams.route \"reasoning\" needs an adapter (none is loaded)");
    return ER_OK;
}

// The public view of n samples and their stats (pointers into x).
static void results_publish(const GenSample *x, int n, const GenStats *st, double t0, ErSample *pub, ErStats *stats) {
    for (int i = 0; i < n; i++)
        pub[i] = (ErSample){x[i].text, x[i].text_len, x[i].tokens, x[i].n_tokens, (int)x[i].finish, x[i].budget_cut,
                            x[i].answer_at};
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
    CbBridge b = {cb, user};
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

int er_generate_raw(ErSession *s, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user) {
    NEED(s, "er_generate_raw", "the session");
    NEED(text, "er_generate_raw", "the text");
    NEED(p, "er_generate_raw", "the parameters (er_gen_params_init fills the defaults)");
    int *ids, n;
    ER_TRY(tok_encode(s->m->tok, text, strlen(text), &ids, &n));
    int rc = generate_ids(s, ids, n, p, cb, user);
    er_free(ids);
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
    int rc = ER_OK;
    char *text = NULL;
    ChatMessage *cm = er_calloc((size_t)n_msgs, sizeof(ChatMessage));
    if (!cm)
        return ER_ENOMEM;
    for (int i = 0; i < n_msgs; i++)
        cm[i] = (ChatMessage){msgs[i].role, msgs[i].content};
    ER_CHECK(chat_render(s->m->style, cm, n_msgs, CHAT_ADD_GENERATION_PROMPT, &text, NULL));
    ER_CHECK(er_generate_raw(s, text, p, cb, user));
done:
    er_free(cm);
    er_free(text);
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
    ErModel *m;        // holds one of m->sessions, as a session does
    DecodeBatch batch;
    ErRequest **live;  // (max_rows) submitted, not done
    int n_live;
};

struct ErRequest {
    ErBatch *b;        // NULL once done (or abandoned)
    EngineRequest *er;
    CbBridge bridge;
    GenSample *samples; // (n)
    ErSample *pub;      // (n) once done
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

int er_batch_open(ErBatch **out, ErModel *m, int max_rows, int max_tokens, int kv_int8) {
    if (out)
        *out = NULL;
    ER_TRY(open_args(out, m, max_rows, max_tokens, "er_batch_open", "row"));
    ErBatch *b = er_calloc(1, sizeof *b);
    if (!b)
        return ER_ENOMEM;
    int rc = ER_OK;
    b->m = m;
    m->sessions++;
    rc = decode_batch_init(&b->batch, &m->model, m->tok, model_adapter(m), kv_int8 ? KV_INT8 : KV_F32, max_rows,
                           max_rows, max_tokens, 128, er_physical_memory());
    if (rc < 0)
        ER_CHECK(er_error_prefix(rc, "er_batch_open"));
    b->live = er_calloc((size_t)max_rows, sizeof *b->live);
    if (!b->live)
        ER_CHECK(ER_ENOMEM);
    *out = b;
    b = NULL;
done:
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
    if (r->status == ER_OK)
        results_publish(r->samples, r->n, &st, r->t0, r->pub, &r->stats);
}

void er_batch_free(ErBatch *b) {
    if (!b)
        return;
    while (b->n_live > 0) // abandoned: the caller's request handles are freed with the batch
        er_request_free(b->live[0]);
    decode_batch_free(&b->batch);
    er_free(b->live);
    ErModel *m = b->m;
    er_free(b);
    if (--m->sessions == 0 && m->freed)
        model_release(m);
}

int er_batch_free_rows(const ErBatch *b) {
    NEED(b, "er_batch_free_rows", "the batch");
    return b->batch.max_rows - decode_batch_rows(&b->batch);
}

int er_batch_submit(ErBatch *b, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user,
                    ErRequest **out) {
    NEED(out, "er_batch_submit", "the output pointer");
    *out = NULL;
    NEED(b, "er_batch_submit", "the batch");
    NEED(text, "er_batch_submit", "the text");
    NEED(p, "er_batch_submit", "the parameters (er_gen_params_init fills the defaults)");
    GenConfig g;
    int force, rc = ER_OK, *ids = NULL, n = 0;
    ER_TRY(gen_config_from_params(b->m, p, &g));
    ER_TRY(route_from_params(b->m, p, &force));
    if (g.n_samples < 1 || g.n_samples > er_batch_free_rows(b))
        return er_error(ER_ERANGE, "er_batch_submit: %d samples asked, %d rows free", g.n_samples,
                        er_batch_free_rows(b));
    ErRequest *r = er_calloc(1, sizeof *r);
    if (!r)
        return ER_ENOMEM;
    r->t0 = time_now();
    r->n = g.n_samples;
    r->bridge = (CbBridge){cb, user};
    r->samples = er_calloc((size_t)r->n, sizeof *r->samples);
    r->pub = er_calloc((size_t)r->n, sizeof *r->pub);
    r->vote_answers = er_calloc((size_t)r->n, sizeof *r->vote_answers);
    r->vote_weights = er_calloc((size_t)r->n, sizeof *r->vote_weights);
    r->vote_counts = er_calloc((size_t)r->n, sizeof *r->vote_counts);
    if (!r->samples || !r->pub || !r->vote_answers || !r->vote_weights || !r->vote_counts)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(tok_encode(b->m->tok, text, strlen(text), &ids, &n));
    r->routed = wants_pipeline(b->m, force);
    r->pc = pipeline_config(b->m, &g, force);
    // The config's strings (stop, budget suffix, prefix) are read at admission; its heads and adapter
    // are the model's, which outlives the batch.
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
    er_free(ids);
    request_destroy(r);
    return rc;
}

int er_batch_step(ErBatch *b) {
    NEED(b, "er_batch_step", "the batch");
    decode_batch_step(&b->batch);
    for (int k = b->n_live - 1; k >= 0; k--) // request_finish moves the last entry into k
        if (engine_request_done(b->live[k]->er))
            request_finish(b->live[k]);
    return b->n_live;
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
const ErStats *er_request_stats(const ErRequest *r) { return r && r->status == ER_OK ? &r->stats : NULL; }
const ErRoute *er_request_route(const ErRequest *r) { return r && r->status == ER_OK && r->routed ? &r->route : NULL; }

void er_request_free(ErRequest *r) {
    if (!r)
        return;
    if (r->b)
        request_finish(r);
    gen_samples_free(r->samples, r->status == ER_OK ? r->n : 0);
    request_destroy(r);
}
