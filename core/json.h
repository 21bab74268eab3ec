// JSON through cJSON: typed field access whose errors name the file and the field, JSONL
// streaming with line numbers, and atomic JSON writes.
#ifndef CORE_JSON_H
#define CORE_JSON_H

#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

// Parses a whole JSON file (up to max_bytes). `*out` is freed with cJSON_Delete. JSON text must be
// UTF-8 (RFC 8259): other bytes are refused here, naming the offset, not later by whoever reads a
// string from it.
int json_parse_file(const char *path, size_t max_bytes, cJSON **out);
// JSON text in memory (need not end in NUL) and what messages call it: its path, or a name such as
// "<config_json>" for text a caller passed.
typedef struct {
    const char *name;
    const char *text; // len bytes; NULL: none given
    size_t len;
} JsonText;
// The same rules on text in memory (more than max_bytes is refused, ER_ERANGE).
int json_parse_text(const JsonText *t, size_t max_bytes, cJSON **out);
// After cJSON stopped at `end` in text (len bytes): the offset of the first byte that is not JSON
// whitespace, or -1 when only whitespace follows (or end is NULL). cJSON accepts anything after the
// first value; every strict parser of the project refuses it.
long json_trailing_at(const char *text, size_t len, const char *end);

// The bracket nesting of len bytes of JSON text, strings and their escapes skipped: the deepest level.
// With in_string and depth non-NULL they receive the state where byte `at` starts (at >= len: at the end).
long json_nesting(const char *s, size_t len, size_t at, int *in_string, long *depth);

// Typed getters. `ctx` names the file (or file:line) in error messages. A missing key is an
// error for json_get_*; json_opt_* leave *out untouched when the key is absent or null.
int json_get_int(const cJSON *obj, const char *key, int64_t *out, const char *ctx);
int json_get_double(const cJSON *obj, const char *key, double *out, const char *ctx);
int json_get_string(const cJSON *obj, const char *key, const char **out, const char *ctx);
int json_opt_int(const cJSON *obj, const char *key, int64_t *out, const char *ctx);
int json_opt_double(const cJSON *obj, const char *key, double *out, const char *ctx);
int json_opt_bool(const cJSON *obj, const char *key, int *out, const char *ctx);
int json_opt_string(const cJSON *obj, const char *key, const char **out, const char *ctx);
// The same for a member of a nested object: messages call it `field` (a path such as
// "model.byte_fallback") instead of `key`.
int json_opt_bool_named(const cJSON *obj, const char *key, const char *field, int *out, const char *ctx);
int json_opt_string_named(const cJSON *obj, const char *key, const char *field, const char **out, const char *ctx);

// What v is, for messages: "a string", "an object", ... ("nothing" for NULL).
const char *json_type_name(const cJSON *v);
// Records "<ctx>: field \"<field>\" must be <want> (got <what v is>)" and returns ER_EFORMAT.
int json_field_error(const char *ctx, const char *field, const char *want, const cJSON *got);

// Streaming JSONL reader. jsonl_next returns 1 with an object, 0 at end of file, or a negative
// status with "path:line: ..." recorded. Blank lines are skipped.
typedef struct {
    FILE *fp;
    char *path;
    char *line;
    size_t cap;
    long lineno;
} JsonlReader;

int jsonl_open(JsonlReader *r, const char *path); // "-" reads stdin
int jsonl_next(JsonlReader *r, cJSON **obj);
void jsonl_close(JsonlReader *r);

// Writes `obj` formatted to `path` atomically.
int json_write_file(const char *path, const cJSON *obj);

#endif
