// The memory store (erinfer/memory.h): the SQLite file, its schema and checks, writes as transactions, filters,
// listing and import. The search is in erinfer/memory_search.c, the vector scan in erinfer/memory_scan.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/json.h"
#include "erinfer/memory_impl.h"

// The schema of version 1. The FTS5 index is an external-content table over entries.text, kept in step by the
// triggers inside each write's own transaction; ids are never reused (AUTOINCREMENT), so an id a conversation
// quoted never names another entry later.
static const char *const SCHEMA_SQL =
    "CREATE TABLE mem_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE entries(id INTEGER PRIMARY KEY AUTOINCREMENT, text TEXT NOT NULL,"
    " metadata TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)), created REAL NOT NULL, vec BLOB);"
    "CREATE INDEX entries_created ON entries(created);"
    "CREATE VIRTUAL TABLE entries_fts USING fts5(text, content='entries', content_rowid='id');"
    "CREATE TRIGGER entries_ai AFTER INSERT ON entries BEGIN"
    " INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text); END;"
    "CREATE TRIGGER entries_ad AFTER DELETE ON entries BEGIN"
    " INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text); END;"
    "CREATE TRIGGER entries_au AFTER UPDATE OF text ON entries BEGIN"
    " INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text);"
    " INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text); END;";

int mem_sql_fail(MemStore *s, int src, const char *what) {
    int code = src & 0xff;
    int st = code == SQLITE_CORRUPT || code == SQLITE_NOTADB ? ER_EFORMAT : code == SQLITE_NOMEM ? ER_ENOMEM : ER_EIO;
    return er_error(st, "%s: %s: %s", s->path, what, s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(src));
}

int mem_prepare(MemStore *s, const char *sql, sqlite3_stmt **st) {
    int src = sqlite3_prepare_v2(s->db, sql, -1, st, NULL);
    return src == SQLITE_OK ? ER_OK : mem_sql_fail(s, src, "SQL");
}

static int exec_sql(MemStore *s, const char *sql, const char *what) {
    int src = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
    return src == SQLITE_OK ? ER_OK : mem_sql_fail(s, src, what);
}

// The first column of the first row of sql as an integer (0 when there is no row).
static int query_int(MemStore *s, const char *sql, int64_t *out, const char *what) {
    sqlite3_stmt *st = NULL;
    int src = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (src == SQLITE_OK) {
        src = sqlite3_step(st);
        *out = src == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
        src = src == SQLITE_ROW || src == SQLITE_DONE ? SQLITE_OK : src;
    }
    int rc = src == SQLITE_OK ? ER_OK : mem_sql_fail(s, src, what);
    sqlite3_finalize(st);
    return rc;
}

static int tx_begin(MemStore *s) { return exec_sql(s, "BEGIN IMMEDIATE", "begin a transaction"); }
static int tx_commit(MemStore *s) { return exec_sql(s, "COMMIT", "commit"); }
static void tx_rollback(MemStore *s) {
    if (!sqlite3_get_autocommit(s->db))
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
}

const char *mem_vec_type_name(MemVecType t) { return t == MEM_VEC_F16 ? "f16" : "int8"; }

int mem_vec_type_parse(const char *name, MemVecType *out) {
    if (name && !strcmp(name, "int8"))
        *out = MEM_VEC_INT8;
    else if (name && !strcmp(name, "f16"))
        *out = MEM_VEC_F16;
    else
        return er_error(ER_EINVAL, "vector type \"%s\": expected int8 or f16", name ? name : "");
    return ER_OK;
}

static int set_meta(MemStore *s, const char *key, const char *value) {
    sqlite3_stmt *st = NULL;
    ER_TRY(mem_prepare(s, "INSERT OR REPLACE INTO mem_meta(key, value) VALUES (?1, ?2)", &st));
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    int src = sqlite3_step(st);
    sqlite3_finalize(st);
    return src == SQLITE_DONE ? ER_OK : mem_sql_fail(s, src, "write mem_meta");
}

static int create_schema(MemStore *s, int dim, MemVecType type) {
    char num[64];
    int rc = ER_OK;
    ER_CHECK(tx_begin(s));
    ER_CHECK(exec_sql(s, SCHEMA_SQL, "create the tables"));
    snprintf(num, sizeof num, "PRAGMA application_id = %d", MEM_APP_ID);
    ER_CHECK(exec_sql(s, num, "set application_id"));
    ER_CHECK(exec_sql(s, "PRAGMA user_version = 1", "set user_version"));
    ER_CHECK(set_meta(s, "format", MEM_FORMAT));
    snprintf(num, sizeof num, "%d", MEM_VERSION);
    ER_CHECK(set_meta(s, "version", num));
    ER_CHECK(set_meta(s, "vec_type", mem_vec_type_name(type)));
    snprintf(num, sizeof num, "%d", dim);
    ER_CHECK(set_meta(s, "dim", num));
    ER_CHECK(tx_commit(s));
    s->dim = dim, s->type = type;
done:
    if (rc < 0)
        tx_rollback(s);
    return rc;
}

// mem_meta's value for key into buf ("" when the row is missing).
static int get_meta(MemStore *s, const char *key, char *buf, size_t cap) {
    sqlite3_stmt *st = NULL;
    ER_TRY(mem_prepare(s, "SELECT value FROM mem_meta WHERE key = ?1", &st));
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int src = sqlite3_step(st);
    buf[0] = 0;
    if (src == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(buf, cap, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return src == SQLITE_ROW || src == SQLITE_DONE ? ER_OK : mem_sql_fail(s, src, "read mem_meta");
}

int mem_read_meta(MemStore *s) {
    char v[64];
    ER_TRY(get_meta(s, "format", v, sizeof v));
    if (strcmp(v, MEM_FORMAT))
        return er_error(ER_EFORMAT, "%s: not an erinfer memory store (mem_meta has format \"%s\", not \"%s\")",
                        s->path, v, MEM_FORMAT);
    ER_TRY(get_meta(s, "version", v, sizeof v));
    if (atoi(v) != MEM_VERSION)
        return er_error(atoi(v) > MEM_VERSION ? ER_EUNSUPPORTED : ER_EFORMAT,
                        "%s: memory store version \"%s\" (this erinfer reads version %d)", s->path, v, MEM_VERSION);
    ER_TRY(get_meta(s, "vec_type", v, sizeof v));
    if (mem_vec_type_parse(v, &s->type) < 0)
        return er_error(ER_EFORMAT, "%s: mem_meta vec_type \"%s\" is not int8 or f16", s->path, v);
    ER_TRY(get_meta(s, "dim", v, sizeof v));
    char *end;
    long d = strtol(v, &end, 10);
    if (!v[0] || *end || d < 0 || d > MEM_MAX_DIM)
        return er_error(ER_EFORMAT, "%s: mem_meta dim \"%s\" is not in [0, %d]", s->path, v, MEM_MAX_DIM);
    s->dim = (int)d;
    return ER_OK;
}

// A file that is there: SQLite, ours (application_id, then mem_meta), and whole (quick_check).
static int check_existing(MemStore *s) {
    int64_t app = 0, tables = 0;
    int rc = query_int(s, "PRAGMA application_id", &app, "read the header");
    if (rc < 0)
        return er_error(rc, "%s: not an erinfer memory store (%s)", s->path, sqlite3_errmsg(s->db));
    if (app != MEM_APP_ID)
        return er_error(ER_EFORMAT, "%s: not an erinfer memory store (a SQLite database with application_id %lld)",
                        s->path, (long long)app);
    ER_TRY(query_int(s, "SELECT count(*) FROM sqlite_master WHERE name IN ('mem_meta', 'entries', 'entries_fts')",
                     &tables, "read the schema"));
    if (tables != 3)
        return er_error(ER_EFORMAT, "%s: not an erinfer memory store (tables missing)", s->path);
    sqlite3_stmt *st = NULL;
    ER_TRY(mem_prepare(s, "PRAGMA quick_check(1)", &st));
    int src = sqlite3_step(st);
    const char *msg = src == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : sqlite3_errmsg(s->db);
    if (src != SQLITE_ROW || !msg || strcmp(msg, "ok")) {
        char line[256]; // quick_check's report on one line
        snprintf(line, sizeof line, "%s", msg ? msg : "?");
        for (char *p = line; *p; p++)
            *p = *p == '\n' || *p == '\r' ? ' ' : *p;
        const char *at = strncmp(line, "*** in database main *** ", 25) ? line : line + 25;
        rc = er_error(ER_EFORMAT, "%s: corrupt memory store (quick_check: %s)", s->path, at);
    }
    sqlite3_finalize(st);
    ER_TRY(rc);
    return mem_read_meta(s);
}

static int open_db(MemStore *s, int create) {
    if (!sqlite3_compileoption_used("ENABLE_FTS5"))
        return er_error(ER_EUNSUPPORTED, "%s: this libsqlite3 (%s) was built without FTS5, which the memory store needs",
                        s->path, sqlite3_libversion());
    struct stat sb;
    if (stat(s->path, &sb) != 0 && !create)
        return er_error(ER_EIO, "%s: no such memory store", s->path);
    if (stat(s->path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return er_error(ER_EINVAL, "%s: not a regular file", s->path);
    int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX;
    int src = sqlite3_open_v2(s->path, &s->db, flags, NULL);
    if (src != SQLITE_OK)
        return mem_sql_fail(s, src, "open");
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, 5000);
    return ER_OK;
}

int mem_open(MemStore **out, const char *path, int create, int dim, MemVecType type) {
    if (!out || !path || !path[0])
        return er_error(ER_EINVAL, "mem_open: no path");
    *out = NULL;
    if (dim < 0 || dim > MEM_MAX_DIM)
        return er_error(ER_EINVAL, "%s: dimension %d is not in [0, %d]", path, dim, MEM_MAX_DIM);
    if (type != MEM_VEC_INT8 && type != MEM_VEC_F16)
        return er_error(ER_EINVAL, "%s: unknown vector type %d", path, (int)type);
    MemStore *s = er_calloc(1, sizeof *s);
    int rc = ER_OK;
    int64_t pages = 0;
    if (!s)
        return ER_ENOMEM;
    s->path = er_strdup(path);
    if (!s->path)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(open_db(s, create));
    rc = query_int(s, "PRAGMA page_count", &pages, "read the header");
    if (rc < 0) {
        rc = er_error(rc, "%s: not an erinfer memory store (%s)", path, sqlite3_errmsg(s->db));
        goto done;
    }
    if (pages == 0 && !create)
        ER_CHECK(er_error(ER_EFORMAT, "%s: not an erinfer memory store (an empty file)", path));
    // Checked before anything is written to it: a file of another program stays as it was.
    if (pages > 0)
        ER_CHECK(check_existing(s));
    // WAL: readers never block the writer, and a kill mid-write leaves every committed transaction; synchronous
    // FULL makes each commit durable against a power cut too, not only against a crash of the process.
    ER_CHECK(exec_sql(s, "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL", "set WAL mode"));
    if (pages == 0)
        ER_CHECK(create_schema(s, dim, type));
    if (dim > 0 && s->dim > 0 && dim != s->dim)
        ER_CHECK(er_error(ER_EINVAL, "%s: the store holds %d-dim vectors, not %d", path, s->dim, dim));
    if (dim > 0 && s->dim == 0) {
        char num[32];
        snprintf(num, sizeof num, "%d", dim);
        ER_CHECK(set_meta(s, "dim", num));
        s->dim = dim;
    }
    *out = s;
    s = NULL;
done:
    mem_close(s);
    return rc;
}

void mem_close(MemStore *s) {
    if (!s)
        return;
    if (s->db)
        sqlite3_close_v2(s->db);
    mem_cache_free(s);
    er_free(s->path);
    er_free(s);
}

const char *mem_path(const MemStore *s) { return s->path; }
int mem_dim(const MemStore *s) { return s->dim; }
MemVecType mem_vec_type(const MemStore *s) { return s->type; }

int mem_count(MemStore *s, int64_t *n) { return query_int(s, "SELECT count(*) FROM entries", n, "count entries"); }

void mem_entry_free(MemEntry *e) {
    if (!e)
        return;
    er_free(e->text);
    er_free(e->metadata);
    memset(e, 0, sizeof *e);
}

// ---- writes ----

int mem_vec_normalize(const float *x, int dim, float *y) {
    double ss = 0.0;
    for (int j = 0; j < dim; j++) {
        if (!isfinite(x[j]))
            return er_error(ER_EINVAL, "vector[%d] is %g: every value must be finite", j, (double)x[j]);
        ss += (double)x[j] * (double)x[j];
    }
    if (ss == 0.0 || !isfinite(ss))
        return er_error(ER_EINVAL, "the vector is all zeros (it has no direction)");
    double inv = 1.0 / sqrt(ss);
    for (int j = 0; j < dim; j++)
        y[j] = (float)(x[j] * inv);
    return ER_OK;
}

int mem_vec_encode(const MemStore *s, const float *x, void *blob) {
    float *y = er_alloc(sizeof(float) * (size_t)s->dim);
    if (!y)
        return ER_ENOMEM;
    int rc = mem_vec_normalize(x, s->dim, y);
    if (rc == ER_OK && s->type == MEM_VEC_INT8) {
        float scale;
        mem_quantize_i8(y, s->dim, (int8_t *)blob + 4, &scale);
        memcpy(blob, &scale, 4);
    } else if (rc == ER_OK) {
        uint16_t *h = blob;
        for (int j = 0; j < s->dim; j++)
            h[j] = f32_to_f16(y[j]);
    }
    er_free(y);
    return rc;
}

static int text_ok(const char *text) {
    if (!text)
        return 0;
    for (const char *p = text; *p; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return 1;
    return 0;
}

// metadata (NULL: "{}") as compact JSON in *out, which must be an object.
static int metadata_canonical(const char *metadata, char **out) {
    *out = NULL;
    if (!metadata || !metadata[0]) {
        *out = er_strdup("{}");
        return *out ? ER_OK : ER_ENOMEM;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(metadata, &end, 1);
    if (!j)
        return er_error(ER_EINVAL, "metadata is not JSON (at byte %ld): %.60s", end ? (long)(end - metadata) : 0L,
                        metadata);
    int rc = ER_OK;
    if (!cJSON_IsObject(j))
        rc = er_error(ER_EINVAL, "metadata must be a JSON object, not %s", json_type_name(j));
    else if (!(*out = cJSON_PrintUnformatted(j)))
        rc = ER_ENOMEM;
    cJSON_Delete(j);
    return rc;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Everything about it checked, its metadata made canonical and its vector encoded, before any transaction.
typedef struct {
    char *metadata;
    void *blob;
    double created;
} Prepared;

static int item_prepare(MemStore *s, const MemItem *it, Prepared *p) {
    memset(p, 0, sizeof *p);
    if (!text_ok(it->text))
        return er_error(ER_EINVAL, "%s: an entry's text is empty", s->path);
    if (strlen(it->text) > MEM_MAX_TEXT)
        return er_error(ER_ERANGE, "%s: an entry's text is longer than %u bytes", s->path, MEM_MAX_TEXT);
    if (it->created >= 0 && !isfinite(it->created))
        return er_error(ER_EINVAL, "%s: created %g is not a time", s->path, it->created);
    p->created = it->created >= 0 ? it->created : now_seconds();
    int rc = metadata_canonical(it->metadata, &p->metadata);
    if (rc < 0)
        return er_error_prefix(rc, "%s", s->path);
    if (!it->vec)
        return ER_OK;
    if (s->dim > 0 && it->dim != s->dim)
        return er_error(ER_EINVAL, "%s: a %d-dim vector for a store of %d-dim vectors", s->path, it->dim, s->dim);
    if (it->dim <= 0 || it->dim > MEM_MAX_DIM)
        return er_error(ER_EINVAL, "%s: vector dimension %d is not in [1, %d]", s->path, it->dim, MEM_MAX_DIM);
    MemStore tmp = *s;
    tmp.dim = it->dim;
    p->blob = er_alloc(mem_blob_bytes(s->type, it->dim));
    if (!p->blob)
        return ER_ENOMEM;
    rc = mem_vec_encode(&tmp, it->vec, p->blob);
    return rc < 0 ? er_error_prefix(rc, "%s", s->path) : ER_OK;
}

static void prepared_free(Prepared *p) {
    er_free(p->metadata);
    er_free(p->blob);
    memset(p, 0, sizeof *p);
}

static int insert_row(MemStore *s, sqlite3_stmt *st, const char *text, const Prepared *p, int64_t *id) {
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, text, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, p->metadata, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 3, p->created);
    if (p->blob)
        sqlite3_bind_blob(st, 4, p->blob, (int)mem_blob_bytes(s->type, s->dim), SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 4);
    int src = sqlite3_step(st);
    if (src != SQLITE_DONE)
        return mem_sql_fail(s, src, "insert an entry");
    *id = sqlite3_last_insert_rowid(s->db);
    return ER_OK;
}

// The first vector of a store without a dimension fixes it, inside the transaction that adds it.
static int fix_dim(MemStore *s, int dim) {
    int64_t stored = 0;
    ER_TRY(query_int(s, "SELECT CAST(value AS INTEGER) FROM mem_meta WHERE key = 'dim'", &stored, "read mem_meta"));
    if (stored > 0 && stored != dim)
        return er_error(ER_EINVAL, "%s: a %d-dim vector for a store of %lld-dim vectors", s->path, dim,
                        (long long)stored);
    char num[32];
    snprintf(num, sizeof num, "%d", dim);
    ER_TRY(set_meta(s, "dim", num));
    s->dim = dim;
    return ER_OK;
}

int mem_add_items(MemStore *s, const MemItem *items, int n, int64_t *ids) {
    if (!s || (!items && n > 0) || n < 0)
        return er_error(ER_EINVAL, "mem_add_items: bad arguments");
    Prepared *p = er_calloc((size_t)(n ? n : 1), sizeof *p);
    int64_t *got = er_calloc((size_t)(n ? n : 1), sizeof *got);
    sqlite3_stmt *st = NULL;
    int rc = ER_OK, dim0 = s->dim, first_dim = 0;
    if (!p || !got)
        ER_CHECK(ER_ENOMEM);
    for (int i = 0; i < n; i++) {
        ER_CHECK(item_prepare(s, &items[i], &p[i]));
        if (items[i].vec && first_dim && items[i].dim != first_dim)
            ER_CHECK(er_error(ER_EINVAL, "%s: vectors of %d and %d dims in one write", s->path, first_dim,
                              items[i].dim));
        first_dim = items[i].vec && !first_dim ? items[i].dim : first_dim;
    }
    ER_CHECK(mem_prepare(s, "INSERT INTO entries(text, metadata, created, vec) VALUES (?1, ?2, ?3, ?4)", &st));
    ER_CHECK(tx_begin(s));
    for (int i = 0; i < n; i++) {
        if (p[i].blob && s->dim == 0)
            ER_CHECK(fix_dim(s, items[i].dim));
        ER_CHECK(insert_row(s, st, items[i].text, &p[i], &got[i]));
    }
    ER_CHECK(tx_commit(s));
    for (int i = 0; i < n; i++) {
        if (ids)
            ids[i] = got[i];
        if (p[i].blob && mem_cache_append(s, got[i], p[i].blob) < 0)
            s->cache_ok = 0; // loaded again at the next search
    }
done:
    if (rc < 0) {
        tx_rollback(s);
        s->dim = dim0;
    }
    sqlite3_finalize(st);
    for (int i = 0; p && i < n; i++)
        prepared_free(&p[i]);
    er_free(p);
    er_free(got);
    return rc;
}

int mem_add(MemStore *s, const char *text, const char *metadata_json, const float *vec, int64_t *id) {
    if (!s)
        return er_error(ER_EINVAL, "mem_add: no store");
    if (vec && s->dim == 0)
        return er_error(ER_EINVAL, "%s: the store has no vector dimension yet (open it with one)", s->path);
    MemItem it = {text, metadata_json, vec, s->dim, -1.0};
    return mem_add_items(s, &it, 1, id);
}

int mem_delete(MemStore *s, int64_t id) {
    sqlite3_stmt *st = NULL;
    int rc = ER_OK;
    ER_CHECK(mem_prepare(s, "DELETE FROM entries WHERE id = ?1", &st));
    ER_CHECK(tx_begin(s));
    sqlite3_bind_int64(st, 1, id);
    int src = sqlite3_step(st);
    if (src != SQLITE_DONE)
        ER_CHECK(mem_sql_fail(s, src, "delete an entry"));
    if (sqlite3_changes(s->db) == 0)
        ER_CHECK(er_error(ER_ERANGE, "%s: no entry %lld", s->path, (long long)id));
    ER_CHECK(tx_commit(s));
    mem_cache_remove(s, id);
done:
    if (rc < 0)
        tx_rollback(s);
    sqlite3_finalize(st);
    return rc;
}

static int entry_from_row(sqlite3_stmt *st, MemEntry *e) {
    const char *text = (const char *)sqlite3_column_text(st, 1), *meta = (const char *)sqlite3_column_text(st, 2);
    e->id = sqlite3_column_int64(st, 0);
    e->text = er_strdup(text ? text : "");
    e->metadata = er_strdup(meta ? meta : "{}");
    e->created = sqlite3_column_double(st, 3);
    e->has_vec = sqlite3_column_int(st, 4);
    return e->text && e->metadata ? ER_OK : ER_ENOMEM;
}

int mem_get(MemStore *s, int64_t id, MemEntry *out) {
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    ER_TRY(mem_prepare(s, "SELECT id, text, metadata, created, vec IS NOT NULL FROM entries WHERE id = ?1", &st));
    sqlite3_bind_int64(st, 1, id);
    int src = sqlite3_step(st), rc = ER_OK;
    if (src == SQLITE_ROW)
        rc = entry_from_row(st, out);
    else if (src == SQLITE_DONE)
        rc = er_error(ER_ERANGE, "%s: no entry %lld", s->path, (long long)id);
    else
        rc = mem_sql_fail(s, src, "read an entry");
    sqlite3_finalize(st);
    if (rc < 0)
        mem_entry_free(out);
    return rc;
}

// ---- filters and listing ----

void mem_filter_init(MemFilter *f) {
    memset(f, 0, sizeof *f);
    f->since = -INFINITY;
    f->until = INFINITY;
}

void mem_filter_free(MemFilter *f) {
    if (!f)
        return;
    for (int i = 0; i < f->n; i++) {
        er_free(f->keys[i]);
        er_free(f->values[i]);
    }
    er_free(f->keys);
    er_free(f->values);
    mem_filter_init(f);
}

int mem_filter_add(MemFilter *f, const char *key, const char *json_value) {
    if (!key || !key[0] || strlen(key) > 256)
        return er_error(ER_EINVAL, "metadata filter: the key must be 1 to 256 bytes");
    for (const char *p = key; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            return er_error(ER_EINVAL, "metadata filter: key \"%s\" has a quote, backslash or control character", key);
    // The value is kept as cJSON prints it: SQLite's JSON reader is stricter than cJSON's (cJSON takes any
    // byte below 0x21 as white space and raw control characters in strings), so what SQLite reads is canonical.
    cJSON *v = json_value ? cJSON_ParseWithOpts(json_value, NULL, 1) : NULL;
    int scalar = v && !cJSON_IsArray(v) && !cJSON_IsObject(v);
    char *canon = scalar ? cJSON_PrintUnformatted(v) : NULL;
    cJSON_Delete(v);
    if (!scalar)
        return er_error(ER_EINVAL, "metadata filter %s: the value %s is not a JSON scalar (quote a string: %s='\"%s\"')",
                        key, json_value ? json_value : "(none)", key, json_value ? json_value : "");
    if (!canon)
        return ER_ENOMEM;
    char **k = er_realloc_array(f->keys, (size_t)f->n + 1, sizeof *k);
    char **vv = k ? er_realloc_array(f->values, (size_t)f->n + 1, sizeof *vv) : NULL;
    if (k)
        f->keys = k;
    if (vv)
        f->values = vv;
    if (!vv) {
        cJSON_free(canon);
        return ER_ENOMEM;
    }
    f->keys[f->n] = er_strdup(key);
    f->values[f->n] = er_strdup(canon);
    cJSON_free(canon);
    if (!f->keys[f->n] || !f->values[f->n]) {
        er_free(f->keys[f->n]);
        er_free(f->values[f->n]);
        return ER_ENOMEM;
    }
    f->n++;
    return ER_OK;
}

int mem_filter_parse(MemFilter *f, const char *spec) {
    const char *eq = spec ? strchr(spec, '=') : NULL;
    if (!eq)
        return er_error(ER_EINVAL, "metadata filter \"%s\": expected KEY=VALUE (VALUE a JSON scalar)",
                        spec ? spec : "");
    size_t kn = (size_t)(eq - spec);
    char *key = er_alloc(kn + 1);
    if (!key)
        return ER_ENOMEM;
    memcpy(key, spec, kn);
    key[kn] = 0;
    int rc = mem_filter_add(f, key, eq + 1);
    er_free(key);
    return rc;
}

// A null value matches a key whose value is JSON null (json_extract gives SQL NULL, which equals nothing).
void mem_filter_sql(const MemFilter *f, StrBuf *sql) {
    if (!f)
        return;
    if (f->since > -INFINITY)
        strbuf_puts(sql, " AND e.created >= ?");
    if (f->until < INFINITY)
        strbuf_puts(sql, " AND e.created <= ?");
    for (int i = 0; i < f->n; i++)
        strbuf_puts(sql, !strcmp(f->values[i], "null") ? " AND json_type(e.metadata, ?) = 'null' AND ? IS NOT NULL"
                                                         : " AND json_extract(e.metadata, ?) = json_extract(?, '$')");
}

int mem_filter_bind(const MemFilter *f, sqlite3_stmt *st, int first) {
    int i = first;
    if (!f)
        return i;
    if (f->since > -INFINITY)
        sqlite3_bind_double(st, i++, f->since);
    if (f->until < INFINITY)
        sqlite3_bind_double(st, i++, f->until);
    for (int k = 0; k < f->n; k++) {
        char *path = sqlite3_mprintf("$.\"%s\"", f->keys[k]);
        sqlite3_bind_text(st, i++, path, -1, sqlite3_free);
        sqlite3_bind_text(st, i++, f->values[k], -1, SQLITE_STATIC);
    }
    return i;
}

int mem_list(MemStore *s, int64_t offset, int64_t limit, const MemFilter *f, MemListFn fn, void *ctx) {
    StrBuf sql = {0};
    sqlite3_stmt *st = NULL;
    MemEntry e = {0};
    int rc = ER_OK, src;
    strbuf_puts(&sql, "SELECT e.id, e.text, e.metadata, e.created, e.vec IS NOT NULL FROM entries e WHERE 1");
    mem_filter_sql(f, &sql);
    strbuf_puts(&sql, " ORDER BY e.id LIMIT ? OFFSET ?");
    if (sql.oom)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(mem_prepare(s, sql.p, &st));
    int at = mem_filter_bind(f, st, 1);
    sqlite3_bind_int64(st, at, limit < 0 ? -1 : limit);
    sqlite3_bind_int64(st, at + 1, offset > 0 ? offset : 0);
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        ER_CHECK(entry_from_row(st, &e));
        ER_CHECK(fn(ctx, &e));
        mem_entry_free(&e);
    }
    if (src != SQLITE_DONE)
        ER_CHECK(mem_sql_fail(s, src, "list entries"));
done:
    mem_entry_free(&e);
    sqlite3_finalize(st);
    er_free(sql.p);
    return rc;
}

// ---- import ----

// One JSONL record as an item (strings borrowed from rec; *meta owned).
static int import_record(const cJSON *rec, const char *ctx, MemItem *it, char **meta) {
    *meta = NULL;
    memset(it, 0, sizeof *it);
    it->created = -1.0;
    if (!cJSON_IsObject(rec))
        return er_error(ER_EFORMAT, "%s: expected a JSON object {\"text\", \"metadata\"?, \"created\"?}", ctx);
    for (const cJSON *c = rec->child; c; c = c->next)
        if (strcmp(c->string, "text") && strcmp(c->string, "metadata") && strcmp(c->string, "created"))
            return er_error(ER_EFORMAT, "%s: unknown field \"%s\" (text, metadata, created)", ctx, c->string);
    ER_TRY(json_get_string(rec, "text", &it->text, ctx));
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(rec, "metadata");
    if (m && !cJSON_IsNull(m)) {
        if (!cJSON_IsObject(m))
            return json_field_error(ctx, "metadata", "an object", m);
        if (!(*meta = cJSON_PrintUnformatted(m)))
            return ER_ENOMEM;
        it->metadata = *meta;
    }
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(rec, "created");
    if (c && !cJSON_IsNull(c)) {
        if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble) || c->valuedouble < 0)
            return json_field_error(ctx, "created", "unix seconds (a number >= 0)", c);
        it->created = c->valuedouble;
    }
    return ER_OK;
}

// One line: parsed, embedded, checked and inserted inside the import's transaction.
static int import_line(MemStore *s, sqlite3_stmt *ins, const cJSON *rec, const char *ctx, MemEmbedFn embed,
                       void *ectx) {
    MemItem it;
    Prepared p = {0};
    char *meta = NULL;
    float *vec = NULL;
    int64_t id;
    int rc = ER_OK;
    ER_CHECK(import_record(rec, ctx, &it, &meta));
    if (embed && text_ok(it.text)) {
        ER_CHECK(embed(ectx, it.text, &vec, &it.dim));
        it.vec = vec;
    }
    rc = item_prepare(s, &it, &p);
    if (rc < 0) {
        rc = er_error_prefix(rc, "%s", ctx);
        goto done;
    }
    if (p.blob && s->dim == 0)
        ER_CHECK(fix_dim(s, it.dim));
    ER_CHECK(insert_row(s, ins, it.text, &p, &id));
done:
    prepared_free(&p);
    er_free(meta);
    er_free(vec);
    return rc;
}

int mem_import(MemStore *s, const char *path, MemEmbedFn embed, void *ctx, int64_t *n_added) {
    JsonlReader r = {0};
    sqlite3_stmt *ins = NULL;
    cJSON *rec = NULL;
    char where[512];
    int rc = ER_OK, got, dim0 = s->dim;
    int64_t n = 0;
    ER_CHECK(jsonl_open(&r, path));
    ER_CHECK(mem_prepare(s, "INSERT INTO entries(text, metadata, created, vec) VALUES (?1, ?2, ?3, ?4)", &ins));
    ER_CHECK(tx_begin(s));
    while ((got = jsonl_next(&r, &rec)) == 1) {
        snprintf(where, sizeof where, "%s:%ld", path, r.lineno);
        ER_CHECK(import_line(s, ins, rec, where, embed, ctx));
        cJSON_Delete(rec);
        rec = NULL;
        n++;
    }
    ER_CHECK(got);
    ER_CHECK(tx_commit(s));
    s->cache_ok = 0; // the new rows are read with the rest at the next vector search
    if (n_added)
        *n_added = n;
done:
    if (rc < 0) {
        tx_rollback(s);
        s->dim = dim0;
    }
    cJSON_Delete(rec);
    sqlite3_finalize(ins);
    jsonl_close(&r);
    return rc;
}
