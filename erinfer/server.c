// erinfer serve: the OpenAI HTTP API on GNU libmicrohttpd (one thread per connection). Requests are
// parsed and checked on their connection's thread (erinfer/server_json.c), then queued as jobs. One
// thread decodes them batched: it admits queued jobs in order while their samples fit the --parallel
// rows of an ErBatch, and each step runs one forward over the rows of every admitted request. With a
// switcher or verifier loaded (or a route forced with an adapter) a request runs the routed pipeline
// in the batch (its prefill and switcher at admission, its verifier and vote in the step that
// finishes it). Prefix reuse: the batch keeps a cached prompt
// per row; a prompt is prefilled from the one holding its longest prefix (a conversation's earlier
// turns, a shared system prompt) when that reuses at least half of it, else it replaces the least
// recently used one, so a new conversation does not evict one that is still going on. A full queue
// answers 503. A streamed job's SSE bytes go from the token callback to the connection's content
// reader; a client that goes away cancels its job (the token callback stops the samples, a queued job
// is dropped). /v1/embeddings runs on its connection's thread, one request at a time, in a session of its own
// beside the batch (er_embed: a KV sequence per text, the base model).
#include "erinfer/server.h"

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "core/threads.h"
#include "erinfer/cli.h"
#include "erinfer/memory_chat.h"
#include "erinfer/server_conn.h"
#include "infer/runner.h"

// SERVE_MAX_URL: a longer target (path and query) is answered 414 here; one that does not fit
// libmicrohttpd's 32 KiB connection buffer (MHD_OPTION_CONNECTION_MEMORY_LIMIT's default) gets the library's
// own HTML 414, as headers over it get its 431: it has no hook for those answers.
enum { SERVE_MAX_BODY = 1 << 20, SERVE_JSON_DEPTH = 64, SERVE_MAX_URL = 8192 };

typedef struct Job Job;
typedef struct Server Server;

struct Job {
    ServeRequest req;
    ServeIds ids;
    pthread_cond_t cond;  // with Server.mu: new output, or done
    StrBuf out;           // SSE events (stream) or the response body
    size_t sent;          // bytes of out the connection has taken
    size_t *streamed;     // (n) content bytes of each sample streamed so far
    int *roled;           // (n) the sample's first chunk (the one with the role) is out
    StrBuf *acc;          // (n) each sample's text so far (tool calls are held back from it)
    ServeWalk *walk;      // (n) where each sample's tokens start in its text (a request with logprobs)
    int *lp_sent;         // (n) the sample's tokens whose logprobs are streamed
    int status;           // HTTP status of a non-streamed response
    int done, cancel;     // cancel is read by the token callback, in the batch thread, without the lock
    int queued;           // in the server's queue (not taken by the batch yet)
    int gone;             // the client hung up (a cancel may also come from the server stopping)
    int refs;             // the connection and, once queued, the batch
    int fd;               // the client's socket, to notice a hang-up while waiting
    Server *srv;
    ErRequest *rq;        // the request in the batch
    int rounds;           // rounds of memory tool calls run (erinfer serve --memory)
    long generated_before; // the tokens those rounds generated (usage counts them)
    Job *next;
};

struct Server {
    ErModel *model;
    const Tokenizer *tok; // the model's: counts prompt tokens on the connections' threads
    ChatStyle style;
    ServeLimits lim;
    const char *api_key, *model_name;
    ServeHosts hosts;     // the Host names answered (hosts.any: every one)
    ConnGuard guard;      // deadlines and caps on the connections
    int threads, queue_max, stopping;
    int n_open;           // requests read and not yet answered to the end: at shutdown their connections
                          // still send their answers
    Job *head, *tail;
    pthread_mutex_t mu;
    pthread_cond_t work;  // a job was queued or the server stops
    ErBatch *batch;       // --parallel rows decoded together, by one thread
    int batch_rows, batch_started;
    int batch_free;       // rows neither decoding nor promised to a job the batch thread is admitting
    pthread_t batch_thread;
    ErSession *embed;     // /v1/embeddings' session (and the memory's), used under embed_mu
    pthread_mutex_t embed_mu;
    MemStore *mem;        // --memory: the store (NULL: none), used under mem_mu through mc
    MemChat mc;
    MemChatEmbedder mem_embed; // the memory's embeddings: the embed session under embed_mu
    pthread_mutex_t mem_mu;
    cJSON *mem_tools;     // the built-in memory tools (srv->lim.memory_tools)
    int mem_tokens, mem_rounds;
    unsigned long counter;
    ErRng rng;            // the seeds of requests that give none
};

// ---- jobs ----

// Lock held (or the job not shared yet).
static void job_unref(Job *j) {
    if (--j->refs > 0)
        return;
    for (int i = 0; j->acc && i < j->req.p.n_samples; i++)
        er_free(j->acc[i].p);
    for (int i = 0; j->walk && i < j->req.p.n_samples; i++)
        serve_walk_free(&j->walk[i]);
    er_free(j->walk);
    er_free(j->lp_sent);
    serve_request_free(&j->req);
    er_free(j->acc);
    er_free(j->streamed);
    er_free(j->roled);
    er_free(j->out.p);
    pthread_cond_destroy(&j->cond);
    er_free(j);
}

// The client hung up: its socket reads end of file (or fails) without blocking.
static int peer_gone(int fd) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// The error a cancelled job answers with: the server stops (503), or the client closed its connection
// (499, nginx's "client closed request": a half-closed client that still reads learns why).
static void cancel_error(ServeError *e, int stopping) {
    memset(e, 0, sizeof *e);
    if (stopping) {
        serve_fail(e, 503, "server_error", NULL, "the server is shutting down; retry later");
        e->code = "server_shutting_down";
    } else {
        serve_fail(e, 499, "invalid_request_error", NULL, "the request was cancelled: the client closed its connection");
        e->code = "request_cancelled";
    }
}

// Lock held: the job's error response (an error event and [DONE] for a stream) as its whole output.
static void job_fail(Job *j, const ServeError *e) {
    StrBuf out = {0};
    if (j->req.stream) {
        serve_chunk_error(&out, e);
    } else {
        char *s = serve_error_json(e);
        strbuf_puts(&out, s ? s : "{}");
        er_free(s);
    }
    strbuf_put(&j->out, out.p ? out.p : "", out.n);
    j->status = out.oom || j->out.oom ? 500 : e->status;
    er_free(out.p);
}

// Lock held: the job is over (answered or dropped).
static void job_done(Job *j) {
    j->done = 1;
    pthread_cond_signal(&j->cond);
    job_unref(j);
}

// Lock held: job j leaves the queue (it is in it) unanswered: it answers e, and the queue's
// reference goes.
static void job_drop(Server *srv, Job *j, const ServeError *e) {
    Job **at = &srv->head, *prev = NULL;
    while (*at != j)
        prev = *at, at = &(*at)->next;
    *at = j->next;
    if (srv->tail == j)
        srv->tail = prev;
    j->next = NULL;
    j->queued = 0;
    __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
    job_fail(j, e);
    job_done(j);
}

// Lock held: the client went away; a job nobody took yet leaves the queue at once (its slot goes to
// the next client), a running one stops at its next token.
static void job_cancel(Server *srv, Job *j) {
    __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
    if (j->queued) {
        ServeError e;
        cancel_error(&e, 0);
        fprintf(stderr, "erinfer serve: %s left the queue: the client went away\n", j->ids.id);
        job_drop(srv, j, &e);
    }
}

// Waits (lock held) up to 100 ms for news on j.
static void job_wait(Server *srv, Job *j) {
    cond_wait_ms(&j->cond, &srv->mu, 100);
    if (!j->done && peer_gone(j->fd)) {
        j->gone = 1;
        job_cancel(srv, j);
    }
}

// Appends under the lock and wakes the connection.
static void job_emit(Server *srv, Job *j, const StrBuf *chunk) {
    pthread_mutex_lock(&srv->mu);
    strbuf_put(&j->out, chunk->p ? chunk->p : "", chunk->n);
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&srv->mu);
}

// The logprobs of the sample's tokens that start in the first `safe` bytes of its text and are not
// streamed yet (NULL: the request has none, or out of memory).
static cJSON *stream_logprobs(Job *j, int sample, size_t safe) {
    const ErSample *x = j->req.logprobs && j->rq ? er_request_progress(j->rq, sample) : NULL;
    if (!x || serve_walk(&j->walk[sample], j->srv->tok, x) < 0)
        return NULL;
    int to = serve_walk_count(&j->walk[sample], safe), from = j->lp_sent[sample];
    if (to <= from) // the role chunk, or text of tokens already sent
        return NULL;
    j->lp_sent[sample] = to;
    return serve_logprobs_json(&j->req, j->srv->tok, x, &j->walk[sample], from, to);
}

// Streams what each sample's text releases, holding back a tool call when the request has tools.
static int on_token(void *user, int sample, const char *text, size_t len) {
    Job *j = user;
    if (j->req.stream && sample < j->req.p.n_samples) {
        StrBuf *acc = &j->acc[sample];
        strbuf_put(acc, text, len);
        size_t safe = serve_stream_safe(&j->req, acc->p, acc->n);
        if (safe > j->streamed[sample] || !j->roled[sample]) {
            StrBuf chunk = {0};
            serve_chunk_delta(&chunk, &j->req, &j->ids, sample, acc->p + j->streamed[sample],
                              safe - j->streamed[sample], !j->roled[sample], stream_logprobs(j, sample, safe));
            job_emit(j->srv, j, &chunk);
            er_free(chunk.p);
            j->streamed[sample] = safe;
            j->roled[sample] = 1;
        }
    }
    return __atomic_load_n(&j->cancel, __ATOMIC_RELAXED);
}

// A generation failure as the client sees it: no library message (it may name files).
static void generation_error(int rc, const Job *j, ServeError *e) {
    memset(e, 0, sizeof *e);
    if (rc == ER_EINVAL || rc == ER_ERANGE)
        serve_fail(e, 400, "invalid_request_error", NULL, "the request cannot be served with this model (%s)",
                   er_status_name(rc));
    else
        serve_fail(e, 500, "server_error", NULL, "generation failed (%s)", er_status_name(rc));
    fprintf(stderr, "erinfer serve: %s: %s\n", j->ids.id, er_last_error());
}

// The job's response from its finished generation (res) or its failure (rc < 0).
static void job_respond(Server *srv, Job *j, int rc, const ServeResult *res) {
    ServeRequest *r = &j->req;
    pthread_mutex_lock(&srv->mu);
    int stopping = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    ServeError e;
    // A cancelled generation stopped early: it answers an error, never a finish_reason that looks complete.
    if (rc == ER_OK && __atomic_load_n(&j->cancel, __ATOMIC_RELAXED)) {
        fprintf(stderr, "erinfer serve: %s cancelled: %s (%ld tokens generated)\n", j->ids.id,
                stopping ? "the server is stopping" : "the client went away", res->stats->generated_tokens);
        cancel_error(&e, stopping);
        rc = ER_EIO;
    } else if (rc < 0) {
        generation_error(rc, j, &e);
    }
    StrBuf out = {0};
    if (rc == ER_OK) {
        char *s = r->stream ? NULL : serve_response_json(r, &j->ids, res);
        if (r->stream)
            serve_chunk_final(&out, r, &j->ids, res, j->streamed, j->roled, j->lp_sent);
        else
            strbuf_puts(&out, s ? s : "{}");
        er_free(s);
    }
    pthread_mutex_lock(&srv->mu);
    if (rc < 0) {
        job_fail(j, &e);
    } else {
        strbuf_put(&j->out, out.p ? out.p : "", out.n);
        j->status = out.oom || j->out.oom ? 500 : 200;
    }
    pthread_mutex_unlock(&srv->mu);
    er_free(out.p);
}

enum { SERVE_MAX_N = 256 }; // --max-n's limit

// ---- the batch: one thread, every live request in each forward ----

// ---- the memory (--memory) ----

// r's "memory" log (created on first use; NULL out of memory).
static cJSON *memory_log(ServeRequest *r) {
    if (!r->memory_log)
        r->memory_log = cJSON_CreateObject();
    return r->memory_log;
}

// Before a chat request is queued: the best entries for its last user message join its system message, as many
// as fit --memory-tokens and the room its context leaves (the answer's max_tokens kept). -1: e says why.
static int memory_recall(Server *srv, ServeRequest *r, ServeError *e) {
    int room = srv->lim.context - r->prompt_tokens - (r->max_tokens ? r->max_tokens : 0) - 16; // 16: the heading's
    int tokens = room < srv->mem_tokens ? room : srv->mem_tokens;                              // line breaks
    int64_t ids[256];
    int n = 0;
    char *block = NULL;
    if (mem_chat_recall(&srv->mc, serve_last_user(r), tokens, &block, ids, &n) < 0) {
        fprintf(stderr, "erinfer serve: memory: %s\n", er_last_error());
        return serve_fail(e, 500, "server_error", NULL, "the memory store failed (see the server's log)");
    }
    if (!block)
        return 0;
    r->memory_block = block;
    cJSON *log = memory_log(r), *a = log ? cJSON_AddArrayToObject(log, "recalled") : NULL;
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)ids[i]));
    return serve_render(r, srv->style, srv->tok, &srv->lim, e);
}

// The log of one round of memory tool calls: {"content", "tool_calls": [{"name", "arguments"}], "results"}.
static void memory_log_round(ServeRequest *r, const char *reply, const MemChatRound *round) {
    cJSON *log = memory_log(r), *rounds = log ? cJSON_GetObjectItemCaseSensitive(log, "tool_rounds") : NULL;
    if (log && !rounds)
        rounds = cJSON_AddArrayToObject(log, "tool_rounds");
    cJSON *o = cJSON_CreateObject(), *cs = cJSON_AddArrayToObject(o, "tool_calls");
    cJSON *rs = cJSON_AddArrayToObject(o, "results");
    char *c = er_alloc(round->content_len + 1);
    if (c) {
        memcpy(c, reply, round->content_len);
        c[round->content_len] = 0;
        cJSON_AddStringToObject(o, "content", c);
        er_free(c);
    }
    for (int i = 0; i < round->n; i++) {
        cJSON *call = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "name", round->calls[i].name);
        cJSON_AddStringToObject(call, "arguments", round->calls[i].arguments);
        cJSON_AddItemToArray(cs, call);
        cJSON_AddItemToArray(rs, cJSON_CreateString(round->results[i]));
    }
    if (rounds)
        cJSON_AddItemToArray(rounds, o);
    else
        cJSON_Delete(o);
}

// Where a job's request was offered the memory tools and its sample wrote calls to them alone: they run, and the
// request goes on with the calls and results in its conversation (returns 1). After --memory-rounds rounds the
// tools are withdrawn from the prompt, so the model answers. 0: the round is the answer; -1: the job failed (its
// error is its answer, and it is released).
static int memory_round(Server *srv, Job *j) {
    ServeRequest *r = &j->req;
    if (!r->memory_tools || er_request_status(j->rq) != ER_OK || __atomic_load_n(&j->cancel, __ATOMIC_RELAXED))
        return 0;
    const ErSample *x = er_request_sample(j->rq, 0);
    MemChatRound round;
    ServeError e = {0};
    int rc = x ? mem_chat_round(&srv->mc, x->text ? x->text : "", x->text_len, &round) : 0;
    if (rc == 0)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "erinfer serve: memory: %s\n", er_last_error());
        rc = serve_fail(&e, 500, "server_error", NULL, "the memory store failed (see the server's log)");
    } else { // the assistant's turn and the tool results join the conversation
        rc = serve_conv_push(r, "assistant", round.turn, &e);
        for (int i = 0; rc == 0 && i < round.n; i++)
            rc = serve_conv_push(r, "tool", round.results[i], &e);
        if (rc == 0)
            memory_log_round(r, x->text, &round);
    }
    size_t clen = round.content_len;
    mem_chat_round_free(&round);
    j->generated_before += er_request_stats(j->rq)->generated_tokens;
    if (rc == 0) {
        strbuf_put(&r->before, x->text, clen);
        if (++j->rounds >= srv->mem_rounds) {
            r->memory_tools = 0;
            r->tools = r->tools_json != NULL;
        }
        rc = serve_render(r, srv->style, srv->tok, &srv->lim, &e);
    }
    // The next round streams on from what the earlier ones said: their content (the calls are never streamed).
    if (rc == 0 && r->stream) {
        pthread_mutex_lock(&srv->mu);
        StrBuf *acc = &j->acc[0];
        if (j->streamed[0] < r->before.n) { // content the round ended on, still held back
            StrBuf chunk = {0};
            serve_chunk_delta(&chunk, r, &j->ids, 0, r->before.p + j->streamed[0], r->before.n - j->streamed[0],
                              !j->roled[0], NULL);
            strbuf_put(&j->out, chunk.p ? chunk.p : "", chunk.n);
            pthread_cond_signal(&j->cond);
            er_free(chunk.p);
            j->roled[0] = 1;
        }
        acc->n = 0;
        strbuf_put(acc, r->before.p, r->before.n);
        j->streamed[0] = r->before.n;
        pthread_mutex_unlock(&srv->mu);
    }
    if (j->walk) {
        serve_walk_free(&j->walk[0]);
        j->lp_sent[0] = 0;
    }
    er_request_free(j->rq);
    j->rq = NULL;
    if (rc == 0 && er_batch_submit(srv->batch, r->prompt, &r->p, on_token, j, &j->rq) < 0) {
        fprintf(stderr, "erinfer serve: %s: %s\n", j->ids.id, er_last_error());
        rc = serve_fail(&e, 500, "server_error", NULL, "generation failed after a memory tool call");
    }
    pthread_mutex_lock(&srv->mu);
    srv->batch_free = er_batch_free_rows(srv->batch);
    if (rc < 0) {
        job_fail(j, &e);
        job_done(j);
    }
    pthread_mutex_unlock(&srv->mu);
    return rc < 0 ? -1 : 1;
}

// --memory with a request's "memory": {"save": true}: the conversation and its answer (the first sample's, with
// n > 1) as one entry; its id goes in the response's erinfer.memory.saved.
static void memory_save(Server *srv, Job *j, const ServeResult *res) {
    ServeRequest *r = &j->req;
    StrBuf answer = {0};
    strbuf_put(&answer, r->before.p ? r->before.p : "", r->before.n);
    strbuf_put(&answer, res->samples[0]->text ? res->samples[0]->text : "", res->samples[0]->text_len);
    char *text = NULL, meta[96];
    int64_t id = 0;
    int rc = answer.oom ? ER_ENOMEM : serve_conv_push(r, "assistant", answer.p, &(ServeError){0}) < 0 ? ER_ENOMEM : 0;
    er_free(answer.p);
    snprintf(meta, sizeof meta, "{\"source\": \"conversation\", \"response\": \"%s\"}", j->ids.id);
    if (rc == 0 && (rc = mem_chat_transcript(r->conv, r->n_conv, &text)) == 0)
        rc = mem_chat_save(&srv->mc, text, meta, &id);
    er_free(text);
    cJSON *log = memory_log(r);
    if (rc < 0)
        fprintf(stderr, "erinfer serve: %s: the conversation was not saved: %s\n", j->ids.id, er_last_error());
    else if (log)
        cJSON_AddNumberToObject(log, "saved", (double)id);
}

// A batched job's request finished (or failed to start: rc): answered and released.
static void batch_answer(Server *srv, Job *j, int rc) {
    const ErSample *samples[SERVE_MAX_N];
    ServeResult res = {0, samples, NULL, NULL, srv->tok};
    ErStats stats;
    if (j->rq) {
        rc = er_request_status(j->rq);
        res.n = er_request_count(j->rq);
        stats = *er_request_stats(j->rq);
        stats.generated_tokens += j->generated_before;
        res.stats = &stats;
        res.route = er_request_route(j->rq);
        for (int i = 0; i < res.n; i++)
            samples[i] = er_request_sample(j->rq, i);
    }
    if (rc == ER_OK && res.n > 0 && j->req.memory_save && !__atomic_load_n(&j->cancel, __ATOMIC_RELAXED))
        memory_save(srv, j, &res);
    job_respond(srv, j, rc, &res);
    er_request_free(j->rq);
    j->rq = NULL;
    pthread_mutex_lock(&srv->mu);
    srv->batch_free = er_batch_free_rows(srv->batch);
    job_done(j);
    pthread_mutex_unlock(&srv->mu);
}

// Lock held: the queue's head joins the batch while its samples fit the free rows (queue order:
// a large n waits for rows rather than being overtaken). The prefill runs without the lock.
static void batch_admit(Server *srv, Job **live, int *n_live) {
    Job *j;
    while ((j = srv->head) && j->req.p.n_samples <= er_batch_free_rows(srv->batch)) {
        srv->head = j->next;
        if (!srv->head)
            srv->tail = NULL;
        j->queued = 0;
        if (__atomic_load_n(&j->cancel, __ATOMIC_RELAXED)) {
            job_done(j);
            continue;
        }
        srv->batch_free -= j->req.p.n_samples; // promised while the prefill runs without the lock
        pthread_mutex_unlock(&srv->mu);
        int rc = er_batch_submit(srv->batch, j->req.prompt, &j->req.p, on_token, j, &j->rq);
        if (rc < 0)
            batch_answer(srv, j, rc);
        else
            live[(*n_live)++] = j;
        pthread_mutex_lock(&srv->mu);
        srv->batch_free = er_batch_free_rows(srv->batch);
    }
}

static void *batch_main(void *arg) {
    Server *srv = arg;
    threads_set(srv->threads);
    int n_live = 0;
    Job **live = er_calloc((size_t)srv->batch_rows, sizeof *live); // a request holds at least one row
    pthread_mutex_lock(&srv->mu);
    while (live && (!srv->stopping || n_live > 0)) {
        if (srv->stopping) // what still decodes is cancelled: its samples stop at this step
            for (int k = 0; k < n_live; k++)
                __atomic_store_n(&live[k]->cancel, 1, __ATOMIC_RELAXED);
        else
            batch_admit(srv, live, &n_live);
        if (n_live == 0) {
            if (!srv->stopping && !srv->head)
                pthread_cond_wait(&srv->work, &srv->mu);
            continue;
        }
        pthread_mutex_unlock(&srv->mu);
        er_batch_step(srv->batch);
        for (int k = n_live - 1; k >= 0; k--) {
            int round = er_request_status(live[k]->rq) != 1 ? memory_round(srv, live[k]) : 1;
            if (round == 1)
                continue; // decoding, or on to its next round
            if (round == 0)
                batch_answer(srv, live[k], ER_OK);
            live[k] = live[--n_live];
        }
        pthread_mutex_lock(&srv->mu);
    }
    pthread_mutex_unlock(&srv->mu);
    er_free(live);
    return NULL;
}

// Lock held: whether a new job of n samples would wait beyond the queue's bound. Jobs that the
// batch's free rows take at once (in queue order) are not waiting.
static int queue_full(const Server *srv, int n) {
    int rows = srv->batch_free, fits = 1, waiting = 0;
    for (const Job *q = srv->head; q; q = q->next) {
        fits = fits && q->req.p.n_samples <= rows;
        if (fits)
            rows -= q->req.p.n_samples;
        else
            waiting++;
    }
    waiting += !(fits && n <= rows);
    return waiting > srv->queue_max;
}

// Queues a parsed request (taking it over); NULL when the queue is full or the server stops (e says
// which).
static Job *job_submit(Server *srv, ServeRequest *r, int fd, ServeError *e) {
    Job *j = er_calloc(1, sizeof *j);
    int n = r->p.n_samples;
    if (j && (!(j->streamed = er_calloc((size_t)n, sizeof *j->streamed)) ||
              !(j->roled = er_calloc((size_t)n, sizeof *j->roled)) ||
              !(j->acc = er_calloc((size_t)n, sizeof *j->acc)) || !(j->walk = er_calloc((size_t)n, sizeof *j->walk)) ||
              !(j->lp_sent = er_calloc((size_t)n, sizeof *j->lp_sent)))) {
        er_free(j->streamed);
        er_free(j->roled);
        er_free(j->acc);
        er_free(j->walk);
        er_free(j);
        j = NULL;
    }
    if (!j) {
        serve_fail(e, 500, "server_error", NULL, "out of memory");
        return NULL;
    }
    j->req = *r; // the parameters point into the request's own strings: moved along
    j->req.p.stop = (const char *const *)j->req.stop;
    j->req.p.route = j->req.route;
    memset(r, 0, sizeof *r);
    j->fd = fd;
    j->srv = srv;
    j->refs = 1;
    pthread_cond_init(&j->cond, NULL);
    pthread_mutex_lock(&srv->mu);
    snprintf(j->ids.id, sizeof j->ids.id, "%s-%08lx%08lx", j->req.chat ? "chatcmpl" : "cmpl",
             (unsigned long)time(NULL) & 0xffffffffUL, ++srv->counter);
    j->ids.created = (long)time(NULL);
    j->ids.model = srv->model_name;
    if (!j->req.seeded) // 53 bits: exact as a JavaScript number too, so any client can send it back
        j->req.p.seed = rng_u64(&srv->rng) >> 11;
    if (srv->stopping || queue_full(srv, j->req.p.n_samples)) {
        if (srv->stopping) {
            cancel_error(e, 1);
        } else {
            serve_fail(e, 503, "server_error", NULL, "the server is busy (its request queue is full); retry later");
            e->code = "queue_full";
        }
        job_unref(j);
        pthread_mutex_unlock(&srv->mu);
        return NULL;
    }
    j->refs = 2;
    j->queued = 1;
    if (srv->tail)
        srv->tail->next = j;
    else
        srv->head = j;
    srv->tail = j;
    pthread_cond_broadcast(&srv->work);
    pthread_mutex_unlock(&srv->mu);
    return j;
}

// ---- HTTP ----

typedef struct {
    StrBuf body;
    int too_big;
    ServeError refused;   // status != 0: refused on its headers (request_check): its body is read and dropped,
                          // never buffered
} Conn;

typedef struct {
    Server *srv;
    Job *job;
} Stream;

static enum MHD_Result respond(struct MHD_Connection *c, int status, const char *type, const char *body) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, const ServeError *e) {
    char *s = serve_error_json(e);
    enum MHD_Result ok = respond(c, e->status, "application/json", s ? s : "{}");
    er_free(s);
    return ok;
}

static enum MHD_Result respond_fail(struct MHD_Connection *c, int status, const char *type, const char *code,
                                    const char *message) {
    ServeError e = {0};
    serve_fail(&e, status, type, NULL, "%s", message);
    e.code = code;
    return respond_error(c, &e);
}

// The stream's bytes as the batch thread writes them; the end when the job is done and all is sent.
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    Stream *st = cls;
    Job *j = st->job;
    pthread_mutex_lock(&st->srv->mu);
    // A job cancelled by the server stopping still answers (an error event): only a client that hung up
    // ends the wait early.
    while (j->sent == j->out.n && !j->done && !j->gone)
        job_wait(st->srv, j);
    size_t n = j->out.n - j->sent;
    if (n > max)
        n = max;
    if (n) // a job dropped before it ran has no output at all (out.p NULL)
        memcpy(buf, j->out.p + j->sent, n);
    j->sent += n;
    int cancelled = j->gone && !j->done;
    pthread_mutex_unlock(&st->srv->mu);
    if (n > 0)
        return (ssize_t)n;
    return cancelled ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
}

// The response is gone (sent, or the client hung up): a job still running is cancelled.
static void stream_free(void *cls) {
    Stream *st = cls;
    pthread_mutex_lock(&st->srv->mu);
    job_cancel(st->srv, st->job);
    job_unref(st->job);
    pthread_mutex_unlock(&st->srv->mu);
    er_free(st);
}

static enum MHD_Result serve_stream(struct MHD_Connection *c, Server *srv, Job *j) {
    Stream *st = er_calloc(1, sizeof *st);
    struct MHD_Response *r = st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st,
                                                                    stream_free)
                                : NULL;
    if (!r) {
        er_free(st);
        pthread_mutex_lock(&srv->mu);
        __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
        job_unref(j);
        pthread_mutex_unlock(&srv->mu);
        return MHD_NO;
    }
    *st = (Stream){srv, j};
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

// A chat or completion request: checked here, generated by the batch thread.
static enum MHD_Result serve_generate(struct MHD_Connection *c, Server *srv, const Conn *cn, int chat) {
    ServeRequest req;
    ServeError e;
    if (serve_parse_request(cn->body.p ? cn->body.p : "", cn->body.n, chat, srv->style, srv->tok, &srv->lim, &req,
                            &e) < 0)
        return respond_error(c, &e);
    if (req.memory_recall && memory_recall(srv, &req, &e) < 0) {
        serve_request_free(&req);
        return respond_error(c, &e);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    Job *j = job_submit(srv, &req, ci ? ci->connect_fd : -1, &e);
    serve_request_free(&req);
    if (!j)
        return respond_error(c, &e);
    if (j->req.stream)
        return serve_stream(c, srv, j);
    pthread_mutex_lock(&srv->mu);
    while (!j->done)
        job_wait(srv, j);
    int status = j->status ? j->status : 500;
    StrBuf body = j->out; // taken over: the copy into the response runs without the server's lock
    j->out = (StrBuf){0};
    job_unref(j);
    pthread_mutex_unlock(&srv->mu);
    enum MHD_Result ok = respond(c, status, "application/json", body.p ? body.p : "{}");
    er_free(body.p);
    return ok;
}

static enum MHD_Result serve_embeddings(struct MHD_Connection *c, Server *srv, const Conn *cn) {
    ServeEmbedRequest req;
    ServeError e;
    int size = er_model_embedding_size(srv->model);
    if (serve_parse_embeddings(cn->body.p ? cn->body.p : "", cn->body.n, &srv->lim, size, &req, &e) < 0)
        return respond_error(c, &e);
    int dims = req.dimensions ? req.dimensions : size;
    float *v = er_alloc(sizeof(float) * (size_t)req.n * dims);
    ErEmbedParams p;
    er_embed_params_init(&p);
    p.dimensions = req.dimensions;
    int tokens = ER_ENOMEM;
    if (v) {
        pthread_mutex_lock(&srv->embed_mu);
        tokens = er_embed(srv->embed, (const char *const *)req.texts, req.n, &p, v, (size_t)req.n * dims);
        pthread_mutex_unlock(&srv->embed_mu);
    }
    enum MHD_Result ok;
    if (tokens < 0) { // a text over the context, or empty, is the client's; anything else the server's
        if (tokens == ER_ERANGE)
            serve_fail(&e, 400, "invalid_request_error", "input", "%s", er_last_error());
        else
            serve_fail(&e, 500, "server_error", NULL, "%s", er_last_error());
        ok = respond_error(c, &e);
    } else {
        StrBuf body = {0};
        serve_embeddings_json(&body, &req, v, dims, srv->model_name, tokens);
        ok = body.oom ? respond_fail(c, 500, "server_error", NULL, "out of memory")
                      : respond(c, 200, "application/json", body.p);
        er_free(body.p);
    }
    er_free(v);
    serve_embed_request_free(&req);
    return ok;
}

static enum MHD_Result serve_models(struct MHD_Connection *c, Server *srv) {
    cJSON *j = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(j, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON_AddStringToObject(m, "id", srv->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "erinfer");
    cJSON_AddItemToArray(d, m);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    enum MHD_Result ok = respond(c, 200, "application/json", s ? s : "{}");
    er_free(s);
    return ok;
}

// "Authorization: Bearer KEY" (the scheme case-insensitive, RFC 7235), the key compared in constant time.
static int authorized(struct MHD_Connection *c, const Server *srv) {
    if (!srv->api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    size_t n = strlen(h), m = strlen(srv->api_key);
    unsigned diff = n != m;
    for (size_t i = 0; i < n && i < m; i++)
        diff |= (unsigned char)(h[i] ^ srv->api_key[i]);
    return diff == 0;
}

static enum MHD_Result respond_too_big(struct MHD_Connection *c) {
    char msg[64];
    snprintf(msg, sizeof msg, "the request body is larger than %d MiB", SERVE_MAX_BODY >> 20);
    return respond_fail(c, 413, "invalid_request_error", "request_too_large", msg);
}

// The connection's local address as text (IPv4 dotted; "" when unknown): a Host naming it is allowed.
static void local_address(struct MHD_Connection *c, char *out, size_t cap) {
    out[0] = 0;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct sockaddr_in a;
    socklen_t n = sizeof a;
    if (ci && getsockname(ci->connect_fd, (struct sockaddr *)&a, &n) == 0 && a.sin_family == AF_INET &&
        !inet_ntop(AF_INET, &a.sin_addr, out, (socklen_t)cap))
        out[0] = 0;
}

static enum MHD_Result add_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 2;
    return MHD_YES;
}

// The checks a request's headers decide, in order, the first failing one answering (e->status; 0 when all
// pass): its Host (403: a page of another site whose name resolves here must not reach the API), the
// length of its target (414), the endpoint (404) and method (405), the API key on /v1/ (401), and on a
// POST a JSON Content-Type (415: a browser sends a cross-site form or "simple" request without asking
// first, but never as JSON).
static void request_check(struct MHD_Connection *c, const Server *srv, const char *url, const char *method,
                          ServeError *e) {
    memset(e, 0, sizeof *e);
    char local[INET_ADDRSTRLEN];
    local_address(c, local, sizeof local);
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    int gen = strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0 ||
              strcmp(url, "/v1/embeddings") == 0;
    int models = strcmp(url, "/v1/models") == 0, health = strcmp(url, "/health") == 0;
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    size_t target = strlen(url);
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, add_length, &target);
    if (!serve_host_allowed(host, &srv->hosts, local[0] ? local : NULL)) {
        serve_fail(e, 403, "invalid_request_error", NULL, "the Host header %s%.64s%s is not allowed here (the server "
                   "answers its own address and the names of --allowed-hosts)", host ? "\"" : "(none)",
                   host ? host : "", host ? "\"" : "");
        e->code = "host_not_allowed";
    } else if (target > SERVE_MAX_URL) {
        serve_fail(e, 414, "invalid_request_error", NULL, "the request's URL is longer than %d bytes", SERVE_MAX_URL);
        e->code = "uri_too_long";
    } else if (!gen && !models && !health) {
        serve_fail(e, 404, "invalid_request_error", NULL, "unknown endpoint");
        e->code = "not_found";
    } else if ((gen && !post) || ((models || health) && !get)) {
        serve_fail(e, 405, "invalid_request_error", NULL, "method not allowed here");
        e->code = "method_not_allowed";
    } else if (strncmp(url, "/v1/", 4) == 0 && !authorized(c, srv)) {
        serve_fail(e, 401, "invalid_request_error", NULL, "missing or invalid API key");
        e->code = "invalid_api_key";
    } else if (post && !serve_content_type_ok(ct)) {
        serve_fail(e, 415, "invalid_request_error", NULL, "the request body's Content-Type must be application/json "
                   "(got %s%.64s%s)", ct ? "\"" : "no Content-Type header", ct ? ct : "", ct ? "\"" : "");
        e->code = "unsupported_media_type";
    }
}

static enum MHD_Result route_request(struct MHD_Connection *c, Server *srv, const Conn *cn, const char *url) {
    if (cn->refused.status)
        return respond_error(c, &cn->refused);
    if (strcmp(url, "/health") == 0)
        return respond(c, 200, "application/json", "{\"status\":\"ok\"}");
    if (strcmp(url, "/v1/models") == 0)
        return serve_models(c, srv);
    if (cn->too_big)
        return respond_too_big(c);
    if (strcmp(url, "/v1/embeddings") == 0)
        return serve_embeddings(c, srv, cn);
    return serve_generate(c, srv, cn, strcmp(url, "/v1/chat/completions") == 0);
}

// A request's first call (its headers are in): checked, its body's deadline set.
static enum MHD_Result request_start(struct MHD_Connection *c, Server *srv, Conn *cn, const char *url,
                                     const char *method) {
    pthread_mutex_lock(&srv->mu);
    srv->n_open++;
    pthread_mutex_unlock(&srv->mu);
    request_check(c, srv, url, method, &cn->refused);
    const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *chunked = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    unsigned long long n = len ? strtoull(len, NULL, 10) : chunked ? SERVE_MAX_BODY : 0;
    cn->too_big = n > SERVE_MAX_BODY;
    conn_guard_headers_in(&srv->guard, c, cn->too_big ? SERVE_MAX_BODY : n);
    // A client waiting on "Expect: 100-continue" (curl, for large bodies) is refused before it sends
    // its body. Others send it anyway, and closing on them loses the answer (node's http reports
    // EPIPE): their body is read and dropped, never buffered, and then refused.
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    if (expect && strcasecmp(expect, "100-continue") == 0 && (cn->refused.status || cn->too_big)) {
        conn_guard_request_in(&srv->guard, c);
        return cn->refused.status ? respond_error(c, &cn->refused) : respond_too_big(c);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    Server *srv = cls;
    Conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = er_calloc(1, sizeof *cn)))
            return MHD_NO;
        *con_cls = cn;
        return request_start(c, srv, cn, url, method);
    }
    if (*upload_size > 0) {
        // A body over the limit, or one refused on its headers, is read and dropped (memory stays
        // bounded), then refused.
        if (!cn->refused.status && !cn->too_big && cn->body.n + *upload_size <= SERVE_MAX_BODY)
            strbuf_put(&cn->body, upload, *upload_size);
        else if (!cn->refused.status)
            cn->too_big = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    conn_guard_request_in(&srv->guard, c);
    if (cn->body.oom)
        return respond_fail(c, 500, "server_error", NULL, "out of memory");
    return route_request(c, srv, cn, url);
}

// The request's answer is sent (or its connection is gone).
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    Server *srv = cls;
    conn_guard_answered(&srv->guard, c); // a kept-alive connection waits for its next request's headers
    Conn *cn = *con_cls;
    if (!cn)
        return;
    er_free(cn->body.p);
    er_free(cn);
    *con_cls = NULL;
    pthread_mutex_lock(&srv->mu);
    srv->n_open--;
    pthread_mutex_unlock(&srv->mu);
}

// ---- the command ----

typedef struct {
    GenFlags g;
    const char *host, *api_key, *api_key_file, *allowed_hosts, *memory;
    int port, parallel, queue, max_n, max_tokens, memory_k, memory_tokens, memory_rounds;
} ServeFlags;

static int serve_parse_flags(int argc, char **argv, ServeFlags *f) {
    gen_flags_default(&f->g);
    f->host = "127.0.0.1";
    f->port = 8080;
    f->parallel = 1;
    f->queue = 64;
    f->max_n = 4;
    f->max_tokens = 512;
    f->memory_k = MEM_CHAT_K;
    f->memory_tokens = MEM_CHAT_TOKENS;
    f->memory_rounds = MEM_CHAT_ROUNDS;
    ArgSpec specs[GEN_FLAGS_MAX + 12];
    int ns = 0;
    // Of the generation flags, serve takes the model, its adapter and heads, the KV type, context and threads;
    // sampling comes with each request.
    ArgSpec all[GEN_FLAGS_MAX];
    int na = gen_flags_specs(&f->g, all);
    static const char *const keep[] = {"model", "adapter", "switcher", "verifier", "kv", "context", "threads", "device"};
    for (int i = 0; i < na; i++)
        for (size_t k = 0; k < sizeof keep / sizeof *keep; k++)
            if (strcmp(all[i].name, keep[k]) == 0)
                specs[ns++] = all[i];
    specs[ns++] = (ArgSpec){"host", ARG_STR, &f->host, "address to listen on (IPv4; 0.0.0.0 = every interface)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"port", ARG_INT, &f->port, "TCP port (0 = any free port, printed at start)", 0, 0, 65535};
    specs[ns++] = (ArgSpec){"parallel", ARG_INT, &f->parallel, "samples decoded together, over all requests, in one "
                            "forward per step (at least --max-n)", 0, 1, 256};
    specs[ns++] = (ArgSpec){"queue", ARG_INT, &f->queue, "requests waiting beyond those; more get HTTP 503", 0, 0,
                            1 << 16};
    specs[ns++] = (ArgSpec){"max-n", ARG_INT, &f->max_n, "largest n (samples) a request may ask for", 0, 1, 256};
    specs[ns++] = (ArgSpec){"max-tokens", ARG_INT, &f->max_tokens, "cap on a request's max_tokens (and its default)",
                            0, 1, 1 << 20};
    specs[ns++] = (ArgSpec){"api-key", ARG_STR, &f->api_key, "require \"Authorization: Bearer KEY\" on /v1/* (visible "
                            "to other users in ps: prefer --api-key-file or ERINFER_API_KEY)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"api-key-file", ARG_STR, &f->api_key_file, "read the API key from the first line of FILE",
                            0, 0, 0};
    specs[ns++] = (ArgSpec){"allowed-hosts", ARG_STR, &f->allowed_hosts, "Host names answered besides the server's "
                            "own addresses (comma-separated, no port; * = any; default: any when --host is 0.0.0.0)",
                            0, 0, 0};
    specs[ns++] = (ArgSpec){"memory", ARG_STR, &f->memory, "a memory store (SQLite; created when missing): chat answers "
                            "recall its best entries and may call memory_search / memory_add (docs/memory.md)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"memory-k", ARG_INT, &f->memory_k, "entries recalled into the system message (0: none)", 0,
                            0, 256};
    specs[ns++] = (ArgSpec){"memory-tokens", ARG_INT, &f->memory_tokens, "tokens the recalled entries may take", 0, 1,
                            1 << 20};
    specs[ns++] = (ArgSpec){"memory-rounds", ARG_INT, &f->memory_rounds, "rounds of memory tool calls in one answer "
                            "(then the tools are withdrawn and the model answers; 0: no memory tools)", 0, 0, 64};
    return args_parse(argc, argv, specs, ns, "erinfer serve --model DIR [--adapter DIR --switcher FILE --verifier FILE] "
                                             "[--host 127.0.0.1 --port 8080] [--parallel K] [--memory FILE] [flags]");
}

// --memory: the store (a new one when the file is missing or empty) searched with the model's embeddings where
// its vectors are the model's, by BM25 alone where they are another's.
static int memory_open(Server *srv, const ServeFlags *f) {
    ER_TRY(mem_open(&srv->mem, f->memory, 1, 0, MEM_VEC_INT8));
    if (!(srv->mem_tools = mem_chat_tools()))
        return er_error(ER_ENOMEM, "no memory for the memory tools");
    srv->mem_embed = (MemChatEmbedder){srv->model, srv->embed, &srv->embed_mu};
    srv->mc = (MemChat){srv->mem, &srv->mem_mu, mem_chat_embed, &srv->mem_embed, srv->tok, f->memory_k};
    const char *why;
    if (!mem_chat_vectors_ok(&srv->mc, er_model_embedding_size(srv->model), &why)) {
        fprintf(stderr, "erinfer serve: warning: %s: %s\n", f->memory, why);
        srv->mc.embed = NULL;
    }
    srv->mem_tokens = f->memory_tokens;
    srv->mem_rounds = f->memory_rounds;
    srv->lim.memory = 1;
    srv->lim.memory_tools = f->memory_rounds > 0 ? srv->mem_tools : NULL;
    int64_t n = 0;
    ER_TRY(mem_count(srv->mem, &n));
    fprintf(stderr, "erinfer serve: memory %s: %lld entries, searched by %s\n", f->memory, (long long)n,
            srv->mc.embed ? "BM25 and vectors" : "BM25");
    return ER_OK;
}

// The model, its adapter and heads, and the batch (--parallel rows, at least --max-n). A request's
// prompt and max_tokens fit the context less the positions the pipeline adds (the reasoning prefix,
// the verifier's prompt).
static int serve_open(Server *srv, const ServeFlags *f) {
    const GenFlags *g = &f->g;
    SessionSpec spec = {g->model, g->adapter, g->switcher, g->verifier, 0, g->context, g->device};
    ER_TRY(runner_load_model(&spec, &srv->model));
    int kv_int8 = strcmp(g->kv, "int8") == 0, positions = runner_context(g->context, f->max_tokens,
                                                                         er_model_max_positions(srv->model));
    spec.kv_int8 = kv_int8;
    char note[1400];
    if (runner_heads_kv_note(&spec, note, sizeof note))
        fprintf(stderr, "erinfer serve: warning: %s\n", note);
    int extra = er_model_extra_positions(srv->model);
    ER_TRY(extra);
    if (positions - extra < 2)
        return er_error(ER_ERANGE, "a context of %d positions leaves no room beside the %d the pipeline adds",
                        positions, extra);
    ER_TRY(chat_style_from_config(f->g.model, &srv->style));
    srv->lim = (ServeLimits){f->max_n, f->max_tokens, positions - extra, SERVE_JSON_DEPTH, g->adapter != NULL,
                             g->adapter || g->switcher || g->verifier, chat_style_hybrid(srv->style), 0, NULL};
    srv->tok = runner_model_tokenizer(srv->model);
    srv->batch_rows = srv->batch_free = f->parallel > f->max_n ? f->parallel : f->max_n;
    ErSessionParams sp;
    er_session_params_init(&sp);
    sp.max_samples = srv->batch_rows;
    sp.max_tokens = positions;
    sp.kv_type = kv_int8 ? ER_KV_INT8 : ER_KV_F32;
    ER_TRY(er_batch_open(&srv->batch, srv->model, &sp));
    sp.max_samples = 1; // /v1/embeddings: one text at a time, up to the context
    ER_TRY(er_session_open(&srv->embed, srv->model, &sp));
    return f->memory ? memory_open(srv, f) : ER_OK;
}

static void serve_close(Server *srv) {
    mem_close(srv->mem);
    cJSON_Delete(srv->mem_tools);
    er_session_free(srv->embed);
    er_batch_free(srv->batch);
    er_model_free(srv->model);
}

// Stops the batch thread: queued jobs are dropped and live ones cancelled, each answering 503
// (server_shutting_down; a stream: an error event and [DONE]).
static void serve_stop_batch(Server *srv) {
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    ServeError e;
    cancel_error(&e, 1);
    while (srv->head)
        job_drop(srv, srv->head, &e);
    pthread_cond_broadcast(&srv->work); // the batch thread cancels its live requests itself
    pthread_mutex_unlock(&srv->mu);
    if (srv->batch_started)
        pthread_join(srv->batch_thread, NULL);
}

// Listens on addr until SIGINT or SIGTERM; the batch thread is stopped either way. Connections
// (erinfer/server_conn.h): room for every request running or queued several times over (clients keep idle
// keep-alive connections), one address at most a quarter of it; a request's headers are due 10 s after
// its connection may send it, its body 10 s later plus 1 s per 64 KiB, and a connection over a cap evicts
// the oldest one still waiting for its request, so that slow clients cannot lock others out. The
// library's own limit leaves room for the connections being shut down; its idle timeout (30 s) still
// bounds a client that stops reading its answer.
static int serve_listen(Server *srv, const ServeFlags *f, struct sockaddr_in *addr) {
    unsigned cap = 4u * (unsigned)(f->queue + f->parallel) + 256;
    if (conn_guard_start(&srv->guard, (int)cap, (int)cap / 4, SERVE_HEADER_S) < 0) {
        serve_stop_batch(srv); // the decode thread runs already: stopped before serve_close frees what it uses
        conn_guard_stop(&srv->guard);
        return ER_ENOMEM;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, on_request, srv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_NOTIFY_CONNECTION, conn_guard_notify, &srv->guard, MHD_OPTION_CONNECTION_LIMIT, cap + cap / 2 + 16,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
    if (!d) {
        int err = errno;
        serve_stop_batch(srv);
        conn_guard_stop(&srv->guard);
        return er_error(ER_EIO, "cannot listen on %s:%d (%s)", f->host, f->port, strerror(err));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "erinfer serve: %s on http://%s:%d/v1 (%d rows decoded together, queue %d)\n", srv->model_name,
            f->host, di ? di->port : f->port, srv->batch_rows, f->queue);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig;
    sigwait(&set, &sig);
    fprintf(stderr, "erinfer serve: stopping\n");
    serve_stop_batch(srv);
    // Every job has its answer now; the connections get up to 5 s to send those answers before they close
    // (a request counts until its answer is sent, not only until its job is over).
    for (int i = 0, left = 1; left && i < 500; i++) {
        pthread_mutex_lock(&srv->mu);
        left = srv->n_open > 0;
        pthread_mutex_unlock(&srv->mu);
        if (left)
            usleep(10 * 1000);
    }
    MHD_stop_daemon(d);
    conn_guard_stop(&srv->guard);
    return ER_OK;
}

// The API key (*key a new string, NULL = none): --api-key, or the first line of --api-key-file (its line
// end cut), or else the environment's ERINFER_API_KEY; --api-key and --api-key-file together are refused.
// An empty key is refused wherever it comes from: it would let an empty Bearer through.
static int serve_api_key(const ServeFlags *f, char **key) {
    *key = NULL;
    if (f->api_key && f->api_key_file)
        return er_error(ER_EINVAL, "give --api-key or --api-key-file, not both");
    const char *env = getenv("ERINFER_API_KEY");
    if (f->api_key_file) {
        char *text;
        size_t n;
        ER_TRY(file_read_all(f->api_key_file, 1 << 16, &text, &n));
        size_t line = strcspn(text, "\n");
        if (line > 0 && text[line - 1] == '\r')
            line--;
        text[line] = 0;
        if (line == 0 || strlen(text) != line) {
            er_free(text);
            return er_error(ER_EINVAL, "%s: the first line (the API key) is %s", f->api_key_file,
                            line == 0 ? "empty" : "not text (it holds a NUL byte)");
        }
        *key = text;
        return ER_OK;
    }
    const char *k = f->api_key ? f->api_key : env;
    if (k && !k[0])
        return er_error(ER_EINVAL, "%s must not be empty", f->api_key ? "--api-key" : "ERINFER_API_KEY");
    if (k && !(*key = er_strdup(k)))
        return ER_ENOMEM;
    return ER_OK;
}

// The key and the Host names: everything cmd_serve checks before it loads the model.
static int serve_setup(const ServeFlags *f, const struct sockaddr_in *addr, Server *srv, char **key) {
    ER_TRY(serve_api_key(f, key));
    ER_TRY(serve_hosts_init(&srv->hosts, f->allowed_hosts, 1));
    // Every interface without a list: any Host (a LAN or proxied name is not known here).
    if (addr->sin_addr.s_addr == htonl(INADDR_ANY) && !f->allowed_hosts) {
        srv->hosts.any = 1;
        fprintf(stderr, "erinfer serve: every Host header is accepted on %s; --allowed-hosts NAMES restricts them "
                "(a defence against DNS rebinding)\n", f->host);
    }
    srv->api_key = *key;
    return ER_OK;
}

int cmd_serve(int argc, char **argv) {
    ServeFlags f = {0};
    int rc = serve_parse_flags(argc, argv, &f);
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("serve");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f.port)};
    if (inet_pton(AF_INET, f.host, &addr.sin_addr) != 1) {
        er_error(ER_EINVAL, "--host \"%s\" is not an IPv4 address", f.host);
        return cli_fail("serve");
    }
    Server srv = {.queue_max = f.queue};
    char *key = NULL;
    if (serve_setup(&f, &addr, &srv, &key) < 0) {
        er_free(key);
        serve_hosts_free(&srv.hosts);
        return cli_fail("serve");
    }
    uint64_t seed;
    if (getentropy(&seed, sizeof seed) != 0) // unseeded requests differ from run to run
        seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    rng_seed(&srv.rng, seed);
    srv.threads = threads_set(f.g.threads);
    // The model's name for /v1/models and responses: its dir's last component.
    const char *slash = strrchr(f.g.model, '/');
    srv.model_name = slash && slash[1] ? slash + 1 : f.g.model;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_mutex_init(&srv.embed_mu, NULL);
    pthread_mutex_init(&srv.mem_mu, NULL);
    pthread_cond_init(&srv.work, NULL);
    // Every thread started from here on (the batch's, the HTTP library's) leaves these signals to sigwait.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    rc = serve_open(&srv, &f);
    if (rc == ER_OK) {
        if (pthread_create(&srv.batch_thread, NULL, batch_main, &srv) != 0)
            rc = er_error(ER_ENOMEM, "cannot start the decode thread");
        else
            srv.batch_started = 1;
    }
    if (rc == ER_OK)
        rc = serve_listen(&srv, &f, &addr);
    else
        serve_stop_batch(&srv);
    serve_close(&srv);
    pthread_cond_destroy(&srv.work);
    pthread_mutex_destroy(&srv.embed_mu);
    pthread_mutex_destroy(&srv.mem_mu);
    pthread_mutex_destroy(&srv.mu);
    serve_hosts_free(&srv.hosts);
    er_free(key);
    return rc < 0 ? cli_fail("serve") : 0;
}
