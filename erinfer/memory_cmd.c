// erinfer memory add|search|list|delete|import: the memory store (erinfer/memory.h) from the command line.
// Without --model, entries are text only and a search is BM25 alone; with it, texts and queries are embedded
// (embedder_* below: the one place these commands meet a model).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "erinfer/cli.h"
#include "erinfer/memory.h"
#include "erinfer/memory_chat.h"

// ---- embeddings ----
// With --model, entries and queries are embedded by er_embed (the base model, pooled as the model dir says);
// a search query gets the model's query prompt where it has one (Qwen3-Embedding's instruction), documents not.
typedef struct {
    const char *model_dir; // NULL: no model (text-only entries, BM25-only search)
    ErModel *m;
    ErSession *s;
    int query;             // embed_text embeds search queries (the model's query prompt first, where it has one)
} Embedder;

static int embedder_open(Embedder *e, const char *model_dir) {
    e->model_dir = model_dir;
    if (!model_dir)
        return ER_OK;
    ER_TRY(er_model_load(&e->m, model_dir));
    ErSessionParams sp;
    er_session_params_init(&sp);
    sp.max_tokens = er_model_max_positions(e->m);
    return er_session_open(&e->s, e->m, &sp);
}

// MemEmbedFn: text's embedding (dim floats, owned by the caller: er_free).
static int embed_text(void *ctx, const char *text, float **vec, int *dim) {
    const Embedder *e = ctx;
    return mem_chat_embed(&(MemChatEmbedder){e->m, e->s, NULL}, text, e->query, vec, dim);
}

static void embedder_close(Embedder *e) {
    er_session_free(e->s);
    er_model_free(e->m);
    memset(e, 0, sizeof *e);
}

// ---- shared flags ----

// Every --where KEY=VALUE (the flag may repeat; args_parse keeps only the last) into f.
static int collect_where(int argc, char **argv, MemFilter *f) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--where") && i + 1 < argc)
            ER_TRY(mem_filter_parse(f, argv[++i]));
        else if (!strncmp(argv[i], "--where=", 8))
            ER_TRY(mem_filter_parse(f, argv[i] + 8));
    }
    return ER_OK;
}

// --since / --until: unix seconds, or a UTC date YYYY-MM-DD[THH:MM[:SS]].
static int parse_time(const char *flag, const char *s, double *out) {
    if (!s)
        return ER_OK;
    char *end;
    double v = strtod(s, &end);
    if (end != s && !*end && isfinite(v)) {
        *out = v;
        return ER_OK;
    }
    struct tm tm = {0};
    const char *rest = strptime(s, "%Y-%m-%d", &tm);
    if (rest && (*rest == 'T' || *rest == ' '))
        rest = strptime(rest + 1, "%H:%M", &tm);
    if (rest && *rest == ':')
        rest = strptime(rest + 1, "%S", &tm);
    if (!rest || *rest)
        return er_error(ER_EINVAL, "--%s \"%s\": expected unix seconds or a UTC date YYYY-MM-DD[THH:MM[:SS]]", flag, s);
    *out = (double)timegm(&tm);
    return ER_OK;
}

typedef struct {
    const char *db, *model, *vec_type, *since, *until, *where;
    int json;
} Common;

#define SPEC_DB {"db", ARG_STR, &c.db, "the memory store, a SQLite file (add and import create it)", 1, 0, 0}
#define SPEC_MODEL                                                                                                 \
    {"model", ARG_STR, &c.model,                                                                                   \
     "embedding model dir: entries get vectors and a search fuses BM25 with them (without it: text only, BM25)", \
     0, 0, 0}
#define SPEC_FILTERS                                                                                               \
    {"where", ARG_STR, &c.where, "KEY=VALUE, VALUE a JSON scalar (tag='\"work\"', n=3); repeat for more", 0, 0, 0}, \
    {"since", ARG_STR, &c.since, "created at or after: unix seconds or YYYY-MM-DD[THH:MM[:SS]] (UTC)", 0, 0, 0},   \
    {"until", ARG_STR, &c.until, "created at or before (as --since)", 0, 0, 0}
#define SPEC_JSON {"json", ARG_FLAG, &c.json, "one JSON object per line", 0, 0, 0}
#define SPEC_VEC_TYPE                                                                                              \
    {"vec-type", ARG_STR, &c.vec_type, "a new store's vector type: int8 (one scale per vector) or f16", 0, 0, 0}

static int filters_from(const Common *c, int argc, char **argv, MemFilter *f) {
    ER_TRY(collect_where(argc, argv, f));
    ER_TRY(parse_time("since", c->since, &f->since));
    return parse_time("until", c->until, &f->until);
}

static int open_store(const Common *c, int create, MemStore **s) {
    MemVecType t = MEM_VEC_INT8;
    if (c->vec_type)
        ER_TRY(mem_vec_type_parse(c->vec_type, &t));
    return mem_open(s, c->db, create, 0, t);
}

static cJSON *hit_json(const MemHit *h) {
    cJSON *o = cJSON_CreateObject(), *m = cJSON_Parse(h->metadata);
    cJSON_AddNumberToObject(o, "id", (double)h->id);
    cJSON_AddNumberToObject(o, "score", h->fused);
    cJSON_AddStringToObject(o, "text", h->text);
    cJSON_AddItemToObject(o, "metadata", m ? m : cJSON_CreateObject());
    cJSON_AddNumberToObject(o, "created", h->created);
    if (h->bm25_rank) {
        cJSON_AddNumberToObject(o, "bm25", h->bm25);
        cJSON_AddNumberToObject(o, "bm25_rank", h->bm25_rank);
    }
    if (h->vec_rank) {
        cJSON_AddNumberToObject(o, "vector_score", h->vec_score);
        cJSON_AddNumberToObject(o, "vector_rank", h->vec_rank);
    }
    return o;
}

static int print_json(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s)
        return er_error(ER_ENOMEM, "no memory to print a result");
    puts(s);
    cJSON_free(s);
    return ER_OK;
}

// ---- the subcommands ----

static int run_add(const Common *c, const char *text, const char *metadata) {
    Embedder e = {0};
    MemStore *s = NULL;
    float *vec = NULL;
    int64_t id;
    int rc = ER_OK;
    MemItem it = {text, metadata, NULL, 0, -1.0};
    ER_CHECK(embedder_open(&e, c->model));
    if (c->model) {
        ER_CHECK(embed_text(&e, text, &vec, &it.dim));
        it.vec = vec;
    }
    ER_CHECK(open_store(c, 1, &s));
    ER_CHECK(mem_add_items(s, &it, 1, &id));
    if (c->json)
        printf("{\"id\":%lld}\n", (long long)id);
    else
        printf("%lld\n", (long long)id);
done:
    mem_close(s);
    er_free(vec);
    embedder_close(&e);
    return rc;
}

static int cmd_memory_add(int argc, char **argv) {
    Common c = {0};
    const char *text = NULL, *metadata = NULL;
    ArgSpec specs[] = {
        SPEC_DB,
        {"text", ARG_STR, &text, "the entry's text", 1, 0, 0},
        {"metadata", ARG_STR, &metadata, "a JSON object ({\"tag\": \"work\"})", 0, 0, 0},
        SPEC_MODEL,
        SPEC_VEC_TYPE,
        SPEC_JSON,
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer memory add --db FILE --text TEXT [--metadata JSON] [--model DIR]  (prints the id)");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || run_add(&c, text, metadata) < 0)
        return cli_fail("memory add");
    return 0;
}

static int run_search(const Common *c, int argc, char **argv, const char *query, int k) {
    Embedder e = {0};
    MemStore *s = NULL;
    MemFilter f;
    MemHit *hits = NULL;
    float *vec = NULL;
    int rc = ER_OK, n = 0;
    MemQuery q = {query, NULL, 0, &f, 0};
    mem_filter_init(&f);
    ER_CHECK(filters_from(c, argc, argv, &f));
    ER_CHECK(embedder_open(&e, c->model));
    if (c->model) {
        e.query = 1;
        ER_CHECK(embed_text(&e, query, &vec, &q.dim));
        q.vec = vec;
    }
    ER_CHECK(open_store(c, 0, &s));
    if (!(hits = er_calloc((size_t)k, sizeof *hits)))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(mem_search(s, &q, hits, k, &n));
    for (int i = 0; i < n; i++) {
        if (c->json) {
            ER_CHECK(print_json(hit_json(&hits[i])));
            continue;
        }
        printf("%lld\t%.4f\t%s", (long long)hits[i].id, hits[i].fused, hits[i].text);
        printf(strcmp(hits[i].metadata, "{}") ? "\t%s\n" : "\n", hits[i].metadata);
    }
done:
    mem_hits_free(hits, n);
    er_free(hits);
    er_free(vec);
    mem_close(s);
    mem_filter_free(&f);
    embedder_close(&e);
    return rc;
}

static int cmd_memory_search(int argc, char **argv) {
    Common c = {0};
    const char *query = NULL;
    int k = 5;
    ArgSpec specs[] = {
        SPEC_DB,
        {"query", ARG_STR, &query, "what to look for", 1, 0, 0},
        {"k", ARG_INT, &k, "how many results", 0, 1, MEM_MAX_K},
        SPEC_FILTERS,
        SPEC_MODEL,
        SPEC_JSON,
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer memory search --db FILE --query TEXT [--k 5] [--where K=V]... [--since T] [--until T] "
                        "[--model DIR] [--json]\n  prints id, fused score (reciprocal rank), text and metadata per hit");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || run_search(&c, argc, argv, query, k) < 0)
        return cli_fail("memory search");
    return 0;
}

static int list_print(void *ctx, const MemEntry *e) {
    const Common *c = ctx;
    if (!c->json) {
        printf("%lld\t%.3f\t%s", (long long)e->id, e->created, e->text);
        printf(strcmp(e->metadata, "{}") ? "\t%s\n" : "\n", e->metadata);
        return ER_OK;
    }
    cJSON *o = cJSON_CreateObject(), *m = cJSON_Parse(e->metadata);
    cJSON_AddNumberToObject(o, "id", (double)e->id);
    cJSON_AddStringToObject(o, "text", e->text);
    cJSON_AddItemToObject(o, "metadata", m ? m : cJSON_CreateObject());
    cJSON_AddNumberToObject(o, "created", e->created);
    cJSON_AddBoolToObject(o, "vector", e->has_vec);
    return print_json(o);
}

static int run_list(const Common *c, int argc, char **argv, int offset, int limit) {
    MemStore *s = NULL;
    MemFilter f;
    int rc = ER_OK;
    mem_filter_init(&f);
    ER_CHECK(filters_from(c, argc, argv, &f));
    ER_CHECK(open_store(c, 0, &s));
    ER_CHECK(mem_list(s, offset, limit, &f, list_print, (void *)c));
done:
    mem_close(s);
    mem_filter_free(&f);
    return rc;
}

static int cmd_memory_list(int argc, char **argv) {
    Common c = {0};
    int offset = 0, limit = -1;
    ArgSpec specs[] = {
        SPEC_DB,
        {"offset", ARG_INT, &offset, "entries to skip (in id order)", 0, 0, 2147483647},
        {"limit", ARG_INT, &limit, "at most this many (-1: all)", 0, -1, 2147483647},
        SPEC_FILTERS,
        SPEC_JSON,
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer memory list --db FILE [--offset N] [--limit N] [--where K=V]... [--since T] [--until T] "
                        "[--json]\n  prints id, created (unix seconds), text and metadata per entry");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || run_list(&c, argc, argv, offset, limit) < 0)
        return cli_fail("memory list");
    return 0;
}

static int cmd_memory_delete(int argc, char **argv) {
    Common c = {0};
    const char *id_text = NULL;
    ArgSpec specs[] = {
        SPEC_DB,
        {"id", ARG_STR, &id_text, "the entry's id", 1, 0, 0},
    };
    int rc = args_parse(argc, argv, specs, 2, "erinfer memory delete --db FILE --id N");
    if (rc == ARGS_HELP)
        return 0;
    MemStore *s = NULL;
    char *end = NULL;
    long long id = rc < 0 ? 0 : strtoll(id_text, &end, 10);
    if (rc >= 0 && (end == id_text || *end))
        rc = er_error(ER_EINVAL, "--id \"%s\": expected an integer", id_text);
    if (rc >= 0)
        rc = open_store(&c, 0, &s);
    if (rc >= 0)
        rc = mem_delete(s, id);
    mem_close(s);
    return rc < 0 ? cli_fail("memory delete") : 0;
}

static int run_import(const Common *c, const char *input) {
    Embedder e = {0};
    MemStore *s = NULL;
    int64_t n = 0;
    int rc = ER_OK;
    ER_CHECK(embedder_open(&e, c->model));
    ER_CHECK(open_store(c, 1, &s));
    ER_CHECK(mem_import(s, input, c->model ? embed_text : NULL, &e, &n));
    if (c->json)
        printf("{\"added\":%lld}\n", (long long)n);
    else
        printf("added %lld entries to %s\n", (long long)n, c->db);
done:
    mem_close(s);
    embedder_close(&e);
    return rc;
}

// `erinfer memory import FILE.jsonl --db DB`: the file may come first, as the synopsis has it.
static int cmd_memory_import(int argc, char **argv) {
    Common c = {0};
    const char *input = NULL;
    char **av = argv;
    if (argc > 1 && argv[1][0] != '-') {
        input = argv[1];
        av = argv + 1, argc--;
        av[0] = argv[0];
    }
    const char *flag_input = NULL;
    ArgSpec specs[] = {
        SPEC_DB,
        {"input", ARG_STR, &flag_input, "the JSONL file (or give it first: import FILE.jsonl --db DB); - for stdin",
         0, 0, 0},
        SPEC_MODEL,
        SPEC_VEC_TYPE,
        SPEC_JSON,
    };
    int rc = args_parse(argc, av, specs, sizeof specs / sizeof specs[0],
                        "erinfer memory import FILE.jsonl --db FILE [--model DIR]\n  one {\"text\", \"metadata\"?, "
                        "\"created\"?} object per line, all added in one transaction or none");
    if (rc == ARGS_HELP)
        return 0;
    input = flag_input ? flag_input : input;
    if (rc >= 0 && !input)
        rc = er_error(ER_EINVAL, "no input: erinfer memory import FILE.jsonl --db FILE");
    if (rc < 0 || run_import(&c, input) < 0)
        return cli_fail("memory import");
    return 0;
}

int cmd_memory(int argc, char **argv) {
    static const ArgCommand cmds[] = {
        {"add", cmd_memory_add, "add one entry (text, metadata JSON; a vector with --model)"},
        {"search", cmd_memory_search, "hybrid search: BM25 and (with --model) vectors, fused by reciprocal rank"},
        {"list", cmd_memory_list, "list entries in id order, with metadata and time filters"},
        {"delete", cmd_memory_delete, "delete one entry by id"},
        {"import", cmd_memory_import, "add a JSONL file's entries in one transaction"},
    };
    return args_dispatch("erinfer memory", cmds, sizeof cmds / sizeof cmds[0], argc, argv);
}
