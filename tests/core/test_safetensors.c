// safetensors: writer -> reader round trips, byte-exact vectors from the reference crate's own
// tests, a file written by Python (json + struct, numpy/torch conversions when present), and one
// crafted bad file per rule of the reference reader, each checked for a one-line message naming
// the file and the rule, and for nothing left open or mapped.
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "tests/core/helpers.h"

// ---------------------------------------------------------------------------------------------
// helpers

static char *tmp_file(void) {
    char tmpl[] = "/tmp/er_st_XXXXXX";
    int fd = mkstemp(tmpl);
    cr_assert_geq(fd, 0, "mkstemp failed");
    close(fd);
    return strdup(tmpl);
}

static char *tmp_dir(void) {
    char tmpl[] = "/tmp/er_std_XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl), "mkdtemp failed");
    return strdup(tmpl);
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp);
    cr_assert_eq(fwrite(b, 1, n, fp), n);
    fclose(fp);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    cr_assert_eq(fread(b, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    *n = (size_t)len;
    return b;
}

// A temp file holding: `declared` as 8 LE bytes, the header bytes, then data_len bytes 0,1,2,...
static char *make_file(uint64_t declared, const char *header, size_t hlen, size_t data_len) {
    size_t n = 8 + hlen + data_len;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(declared >> (8 * i));
    memcpy(b + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hlen + i] = (unsigned char)i;
    char *path = tmp_file();
    write_bytes(path, b, n);
    free(b);
    return path;
}

static char *make_st(const char *header, size_t data_len) {
    return make_file(strlen(header), header, strlen(header), data_len);
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static int count_maps(const char *path) {
    FILE *fp = fopen("/proc/self/maps", "r");
    cr_assert_not_null(fp);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, fp))
        if (strstr(line, path))
            n++;
    fclose(fp);
    return n;
}

// Opens `path` (consumed), expects failure with a one-line message that starts with the path and
// contains `keyword`, and checks nothing was left open, mapped or allocated in the struct.
static void expect_bad_file(char *path, const char *keyword) {
    int fds = count_fds();
    StFile f;
    memset(&f, 0xab, sizeof f);
    er_clear_error();
    int rc = safetensors_open(&f, path);
    const char *msg = er_last_error();
    cr_assert_lt(rc, 0, "%s opened, but should fail with \"%s\"", path, keyword);
    cr_assert_eq(er_last_status(), rc);
    cr_assert_eq(strncmp(msg, path, strlen(path)), 0, "message does not start with the path: %s", msg);
    cr_assert_not_null(strstr(msg, keyword), "message lacks \"%s\": %s", keyword, msg);
    cr_assert_null(strchr(msg, '\n'), "message is not one line: %s", msg);
    cr_assert_eq(count_fds(), fds, "file descriptor leaked");
    cr_assert_eq(count_maps(path), 0, "mapping left behind");
    cr_assert_null(f.map);
    cr_assert_null(f.tensors);
    cr_assert_null(f.path);
    cr_assert_null(f.meta_keys);
    cr_assert_eq(f.n_tensors, 0);
    cr_assert_eq(f.n_meta, 0);
    safetensors_close(&f); // harmless on the cleared struct
#ifdef __SANITIZE_ADDRESS__
    // LeakSanitizer only prints at exit and the test would still pass: check now, per file.
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "%s: the failed open leaked memory (report above)", path);
#endif
    unlink(path);
    free(path);
}

static void expect_bad(const char *header, size_t data_len, const char *keyword) {
    expect_bad_file(make_st(header, data_len), keyword);
}

// Opens a good file built from `header` + data_len bytes; the caller closes and unlinks.
static char *open_good(StFile *f, const char *header, size_t data_len) {
    char *path = make_st(header, data_len);
    int rc = safetensors_open(f, path);
    cr_assert_eq(rc, ER_OK, "valid header refused: %s", er_last_error());
    return path;
}

static void close_good(StFile *f, char *path) {
    safetensors_close(f);
    unlink(path);
    free(path);
}

#define T1(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

// ---------------------------------------------------------------------------------------------
// one bad file per rule

Test(safetensors, bad_header_too_large) {
    expect_bad_file(make_file(ST_MAX_HEADER + 1ull, "{}", 2, 0), "exceeds the limit");
    expect_bad_file(make_file(UINT64_MAX, "{}", 2, 0), "exceeds the limit");
    expect_bad_file(make_file(1ull << 63, "{}", 2, 0), "exceeds the limit");
    // the limit itself is allowed: this one fails on the next rule instead
    expect_bad_file(make_file(ST_MAX_HEADER, "{}", 2, 0), "past the end of the file");
}

Test(safetensors, bad_header_length_past_end_of_file) {
    expect_bad_file(make_file(3, "{}", 2, 0), "past the end of the file");
    expect_bad_file(make_file(1000, "{}      ", 8, 16), "past the end of the file");
}

Test(safetensors, bad_file_shorter_than_8_bytes) {
    for (size_t n = 0; n < 8; n++) {
        char *path = tmp_file();
        write_bytes(path, "\x02\0\0\0\0\0\0", n);
        expect_bad_file(path, "too small");
    }
}

Test(safetensors, bad_path_missing_or_directory) {
    StFile f;
    cr_assert_eq(safetensors_open(&f, "/nonexistent/er/x.safetensors"), ER_EIO);
    cr_assert(strstr(er_last_error(), "/nonexistent/er/x.safetensors: cannot open"), "%s", er_last_error());
    char *dir = tmp_dir();
    cr_assert_eq(safetensors_open(&f, dir), ER_EIO);
    cr_assert(strstr(er_last_error(), "not a regular file"), "%s", er_last_error());
    rmdir(dir);
    free(dir);
}

Test(safetensors, bad_header_not_utf8) {
    expect_bad("{\"w\xff\":{}}", 0, "not valid UTF-8");
    expect_bad("{\"\xc0\xaf\":{}}", 0, "not valid UTF-8");          // overlong '/'
    expect_bad("{\"\xe0\x80\xaf\":{}}", 0, "not valid UTF-8");      // overlong, 3 bytes
    expect_bad("{\"\xed\xa0\x80\":{}}", 0, "not valid UTF-8");      // surrogate U+D800
    expect_bad("{\"\xf4\x90\x80\x80\":{}}", 0, "not valid UTF-8");  // above U+10FFFF
    expect_bad("{\"\xe2\x82\":{}}", 0, "not valid UTF-8");          // truncated sequence
    expect_bad("{\"\x80\":{}}", 0, "not valid UTF-8");              // lone continuation byte
    expect_bad("{}   \xe2\x82", 0, "not valid UTF-8");              // cut at the very end
    expect_bad("{\"__metadata__\":{\"k\":\"\xfe\"}}", 0, "not valid UTF-8");
}

Test(safetensors, bad_header_not_json) {
    expect_bad("{\"w\":{\"dtype\":\"F32\",}}", 0, "not valid JSON");
    expect_bad("{\"w\"}", 0, "not valid JSON");
    expect_bad("{\"w\":", 0, "not valid JSON");
    expect_bad("{", 0, "not valid JSON");
    expect_bad("{" T1("w", "F32", "[1]", 0, 4), 4, "not valid JSON"); // unclosed
    expect_bad("{'w':{}}", 0, "not valid JSON");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":+1}}", 4, "not valid JSON");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":tru}}", 4, "not valid JSON");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":[1 2]}}", 4, "not valid JSON");
    expect_bad("{\"a\\xb\":{}}", 0, "not valid JSON");         // bad escape
    expect_bad("{\"a\\u12\":{}}", 0, "not valid JSON");        // short \u escape
    expect_bad("{\"a\\u00zz\":{}}", 0, "not valid JSON");      // bad hex digits (cJSON would read \u0000)
    expect_bad("{\"a\\u00\"}", 0, "not valid JSON");           // \u cut by the closing quote
    expect_bad("{\"a\\ud800\":{}}", 0, "not valid JSON");      // lone high surrogate
    expect_bad("{\"a\\udc00\":{}}", 0, "not valid JSON");      // lone low surrogate
    expect_bad("{\"a\\ud800\\u0041\":{}}", 0, "not valid JSON");
    expect_bad("{\"a\\", 0, "not valid JSON");
    expect_bad("{}x", 0, "unexpected data after");
    expect_bad("{}{}", 0, "unexpected data after");
}

Test(safetensors, bad_header_not_json_nul_and_depth) {
    // A NUL byte inside the header (valid UTF-8, not valid JSON outside strings)
    expect_bad_file(make_file(4, "{}\0 ", 4, 0), "unexpected data after");
    // NUL bytes inside a string (cJSON would cut it) or between tokens (cJSON skips it as whitespace)
    expect_bad_file(make_file(10, "{\"a\0b\":{}}", 10, 0), "NUL byte at header byte 3");
    expect_bad_file(make_file(4, "{\0 }", 4, 0), "NUL byte at header byte 1");
    // \u0000 would silently cut a C string: refused, in names, dtypes and metadata alike
    expect_bad("{\"a\\u0000b\":{}}", 0, "\\u0000");
    expect_bad("{" T1("w", "F32\\u0000x", "[1]", 0, 4) "}", 4, "\\u0000");
    expect_bad("{\"__metadata__\":{\"k\":\"v\\u0000\"}}", 0, "\\u0000");
    // an escaped backslash followed by "u0000" is text, not an escape
    StFile f;
    char *p = open_good(&f, "{\"__metadata__\":{\"k\":\"C:\\\\u0000\\\\users\"}}", 0);
    cr_assert_str_eq(safetensors_meta(&f, "k"), "C:\\u0000\\users");
    close_good(&f, p);
    // unknown fields are skipped, but not to unbounded depth (cJSON's limit: 1000 levels)
    char h[2400];
    int k = snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":");
    for (int i = 0; i < 1100; i++)
        h[k++] = '[';
    for (int i = 0; i < 1100; i++)
        h[k++] = ']';
    snprintf(h + k, sizeof h - k, "}}");
    expect_bad(h, 4, "not valid JSON");
}

Test(safetensors, bad_header_not_an_object) {
    expect_bad("[1,2]", 0, "not a JSON object");
    expect_bad("\"x\"", 0, "not a JSON object");
    expect_bad("null", 0, "not a JSON object");
    expect_bad("12345678", 0, "not a JSON object");
    expect_bad(" {}", 0, "not a JSON object"); // must start with '{'
    expect_bad_file(make_file(0, "", 0, 0), "not a JSON object");
}

Test(safetensors, bad_metadata_value_not_string) {
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "must be a string");
    expect_bad("{\"__metadata__\":{\"a\":\"b\",\"k\":null}}", 0, "must be a string");
    expect_bad("{\"__metadata__\":{\"k\":[\"a\"]}}", 0, "must be a string");
    expect_bad("{\"__metadata__\":{\"k\":{\"a\":\"b\"}}}", 0, "\"k\" must be a string");
}

Test(safetensors, bad_metadata_not_object) {
    expect_bad("{\"__metadata__\":\"x\"}", 0, "__metadata__ must be an object");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__ must be an object");
    expect_bad("{\"__metadata__\":5}", 0, "__metadata__ must be an object");
    expect_bad("{\"__metadata__\":true}", 0, "__metadata__ must be an object");
}

Test(safetensors, bad_unknown_dtype) {
    expect_bad("{" T1("w", "F7", "[1]", 0, 4) "}", 4, "unknown dtype \"F7\"");
    expect_bad("{" T1("w", "f32", "[1]", 0, 4) "}", 4, "unknown dtype");
    expect_bad("{" T1("w", "float32", "[1]", 0, 4) "}", 4, "unknown dtype");
    expect_bad("{" T1("w", "F4", "[2]", 0, 1) "}", 1, "unknown dtype");
    expect_bad("{" T1("w", "", "[1]", 0, 4) "}", 4, "unknown dtype");
    expect_bad("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype must be a string");
    expect_bad("{\"w\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype must be a string");
}

Test(safetensors, bad_shape_not_list_of_nonnegative_ints) {
    // (cJSON reads 1e2 and 1.0 as the integers 100 and 1: see accepts_reference_layouts)
    const char *shapes[] = {"3", "\"[2]\"", "[-1]", "[1.5]", "[\"2\"]", "[1e-2]", "[null]", "[2,-0]", "{}", "null",
                            "[[1]]", "[true]", "[1e400]", "[9007199254740992]"};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        char h[256];
        snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"shape\":%s,\"data_offsets\":[0,1]}}", shapes[i]);
        expect_bad(h, 1, "shape must be a list of non-negative integers");
    }
}

Test(safetensors, bad_too_many_dims) {
    expect_bad("{" T1("w", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, "more than 8 dimensions");
    // exactly ST_MAX_DIMS is fine
    StFile f;
    char *p = open_good(&f, "{" T1("w", "F32", "[1,1,1,1,1,1,2,1]", 0, 8) "}", 8);
    cr_assert_eq(f.tensors[0].ndim, 8);
    cr_assert_eq(f.tensors[0].shape[6], 2);
    close_good(&f, p);
}

Test(safetensors, bad_data_offsets_malformed) {
    // (cJSON reads 4.0 and 4e0 as the integer 4: see accepts_reference_layouts)
    const char *offs[] = {"[0]", "[0,4,8]", "\"0,4\"", "[-1,4]", "[0,\"4\"]", "{}", "[]", "4", "null",
                          "[0,18446744073709551616]", "[0,9007199254740992]", "[0,4.5]"};
    for (size_t i = 0; i < sizeof offs / sizeof *offs; i++) {
        char h[256];
        snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":%s}}", offs[i]);
        expect_bad(h, 4, "data_offsets must be [begin, end]");
    }
}

Test(safetensors, bad_entry_missing_field_or_not_object) {
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "missing field \"data_offsets\"");
    expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "missing field \"dtype\"");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "missing field \"shape\"");
    expect_bad("{\"w\":{}}", 0, "tensor \"w\": missing field");
    expect_bad("{\"w\":5}", 4, "tensor \"w\": entry must be an object");
    expect_bad("{\"w\":[0,4]}", 4, "entry must be an object");
    // a name with a newline still gives a one-line message
    expect_bad("{\"a\\nb\":5}", 0, "tensor \"a?b\": entry must be an object");
}

Test(safetensors, bad_begin_after_end) {
    expect_bad("{" T1("w", "F32", "[1]", 8, 4) "}", 8, "begin > end");
}

Test(safetensors, bad_size_mismatch) {
    char *path = make_st("{" T1("w", "F32", "[2,3]", 0, 20) "}", 20);
    char want[512];
    snprintf(want, sizeof want, "%s: tensor \"w\": shape [2,3] F32 needs 24 bytes but data_offsets span 20", path);
    StFile f;
    cr_assert_eq(safetensors_open(&f, path), ER_EFORMAT);
    cr_assert_str_eq(er_last_error(), want);
    unlink(path);
    free(path);
    expect_bad("{" T1("w", "BF16", "[3]", 0, 8) "}", 8, "needs 6 bytes but data_offsets span 8");
    expect_bad("{" T1("w", "F32", "[]", 0, 0) "}", 0, "needs 4 bytes");
    expect_bad("{" T1("w", "F32", "[0]", 0, 4) "}", 4, "needs 0 bytes");
}

Test(safetensors, bad_gap_between_tensors) {
    expect_bad("{" T1("a", "F32", "[1]", 0, 4) "," T1("b", "F32", "[1]", 8, 12) "}", 12, "gap of 4 bytes");
}

Test(safetensors, bad_overlapping_tensors) {
    expect_bad("{" T1("a", "F32", "[2]", 0, 8) "," T1("b", "F32", "[2]", 4, 12) "}", 12, "overlaps");
    expect_bad("{" T1("a", "F32", "[2]", 0, 8) "," T1("b", "F32", "[2]", 0, 8) "}", 8, "overlaps");
}

Test(safetensors, bad_first_tensor_not_at_zero) {
    expect_bad("{" T1("a", "F32", "[1]", 4, 8) "}", 8, "must start at 0");
}

Test(safetensors, bad_buffer_not_fully_covered) {
    expect_bad("{" T1("a", "F32", "[1]", 0, 4) "}", 8, "not fully covered");
    expect_bad("{}", 1, "not fully covered");
    expect_bad("{\"__metadata__\":{\"a\":\"b\"}}", 16, "16 trailing bytes");
}

Test(safetensors, bad_tensor_past_end_of_buffer) {
    expect_bad("{" T1("a", "F32", "[2]", 0, 8) "}", 4, "past the end of the data buffer");
    expect_bad("{" T1("a", "F32", "[2]", 0, 8) "," T1("b", "U8", "[1]", 8, 9) "}", 8, "tensor \"b\"");
}

Test(safetensors, bad_numel_overflow) {
    expect_bad("{" T1("w", "F32", "[4294967296,4294967296]", 0, 0) "}", 0, "element count overflows");
    // folded left to right like the reference: a later 0 does not save it
    expect_bad("{" T1("w", "F32", "[4294967296,4294967296,0]", 0, 0) "}", 0, "element count overflows");
    expect_bad("{" T1("w", "F32", "[4294967296,1073741824]", 0, 0) "}", 0, "byte size overflows");
    // cJSON holds numbers as doubles: integers from 2^53 on are not exact and are refused
    expect_bad("{" T1("w", "U8", "[9007199254740992]", 0, 0) "}", 0, "out of range");
    expect_bad("{" T1("w", "U8", "[0]", 0, 9007199254740992) "}", 0, "out of range");
    expect_bad("{" T1("w", "U8", "[9223372036854775808]", 0, 0) "}", 0, "too large");
    expect_bad("{" T1("w", "U8", "[99999999999999999999999]", 0, 0) "}", 0, "shape must be a list");
    // a huge offset pair that matches a huge shape still has to fit the file
    expect_bad("{" T1("w", "U8", "[18446744073709551615]", 0, 18446744073709551615) "}", 0, "too large");
    expect_bad("{" T1("w", "U8", "[4503599627370496]", 0, 4503599627370496) "}", 0,
               "past the end of the data buffer");
}

Test(safetensors, bad_duplicate_names) {
    expect_bad("{" T1("w", "F32", "[1]", 0, 4) "," T1("w", "F32", "[1]", 4, 8) "}", 8, "duplicate tensor name \"w\"");
    expect_bad("{" T1("w", "F32", "[0]", 0, 0) "," T1("w", "F32", "[0]", 0, 0) "}", 0, "duplicate tensor name");
    // the same name spelt with an escape is still the same name
    expect_bad("{" T1("w", "F32", "[1]", 0, 4) "," T1("\\u0077", "F32", "[1]", 4, 8) "}", 8, "duplicate tensor name");
    expect_bad("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "duplicate __metadata__ key \"k\"");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key \"__metadata__\"");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "duplicate field \"dtype\"");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "duplicate field \"shape\"");
}

// ---------------------------------------------------------------------------------------------
// what the reader accepts

Test(safetensors, accepts_reference_layouts) {
    StFile f;
    // no tensors, padded
    char *p = open_good(&f, "{}      ", 0);
    cr_assert_eq(f.n_tensors, 0);
    cr_assert_eq(f.n_meta, 0);
    close_good(&f, p);
    // whitespace between tokens and after the object
    p = open_good(&f, "{ \"w\" :\n{\"dtype\" : \"I32\", \"shape\":[ 2 , 2 ],\t\"data_offsets\":[0,16] } } \r\n\t ", 16);
    cr_assert_eq(f.n_tensors, 1);
    cr_assert_eq(f.tensors[0].dtype, DT_I32);
    close_good(&f, p);
    // unknown fields are ignored (as serde does), __metadata__ may be null
    p = open_good(&f, "{\"__metadata__\":null,\"w\":{\"x\":{\"a\":[1,-2.5e3,true,false,null,\"s\"]},\"dtype\":\"U8\","
                      "\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
    cr_assert_eq(f.n_meta, 0);
    cr_assert_eq(f.tensors[0].nbytes, 3);
    close_good(&f, p);
    // the example from the reference crate's documentation
    p = open_good(&f, "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    cr_assert_eq(st_numel(&f.tensors[0]), 4);
    close_good(&f, p);
    // F8 types
    p = open_good(&f, "{" T1("a", "F8_E4M3", "[2]", 0, 2) "," T1("b", "F8_E5M2", "[1]", 2, 3) "}", 3);
    cr_assert_eq(f.tensors[0].dtype, DT_F8_E4M3);
    cr_assert_eq(f.tensors[1].dtype, DT_F8_E5M2);
    close_good(&f, p);
    // Spellings serde refuses but cJSON reads as the values they spell (01, 1e2, 2.0, 4., a raw
    // tab inside a string): they cannot change what a file means, so they are accepted.
    p = open_good(&f, "{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[01,1e2,2.0],\"data_offsets\":[0,200.]}}", 200);
    cr_assert_str_eq(f.tensors[0].name, "a\tb");
    cr_assert_eq(f.tensors[0].shape[0], 1);
    cr_assert_eq(f.tensors[0].shape[1], 100);
    cr_assert_eq(f.tensors[0].shape[2], 2);
    close_good(&f, p);
}

Test(safetensors, tensors_in_offset_order_with_empty_and_scalar) {
    // header order differs from offset order; empty tensors sit between others and at the end
    StFile f;
    char *p = open_good(&f,
                        "{" T1("z_last", "U8", "[0,7]", 13, 13) "," T1("c", "U8", "[]", 12, 13) ","
                        T1("b", "F32", "[2]", 4, 12) "," T1("e0", "F16", "[2,0,3]", 4, 4) "," T1("a", "I32", "[1]", 0, 4)
                        ",\"__metadata__\":{\"fmt\":\"pt\",\"k\\u00e9\":\"v\\n\\\"q\\\"\"}}",
                        13);
    const char *order[] = {"a", "e0", "b", "c", "z_last"};
    const size_t begin[] = {0, 4, 4, 12, 13};
    cr_assert_eq(f.n_tensors, 5);
    unsigned char *base = (unsigned char *)f.map + f.map_size - 13;
    for (int i = 0; i < 5; i++) {
        cr_assert_str_eq(f.tensors[i].name, order[i]);
        cr_assert_eq((const unsigned char *)f.tensors[i].data - base, (long)begin[i], "%s", order[i]);
    }
    cr_assert_eq(f.tensors[1].nbytes, 0);
    cr_assert_eq(st_numel(&f.tensors[1]), 0);
    cr_assert_eq(f.tensors[3].ndim, 0);
    cr_assert_eq(st_numel(&f.tensors[3]), 1);
    cr_assert_eq(*(const unsigned char *)f.tensors[3].data, 12);
    cr_assert_eq(f.tensors[4].ndim, 2);
    cr_assert_eq(f.tensors[4].shape[1], 7);
    const StTensor *b = safetensors_find(&f, "b");
    cr_assert_not_null(b);
    cr_assert_eq(b->dtype, DT_F32);
    cr_assert_eq(b->nbytes, 8);
    cr_assert_null(safetensors_find(&f, "nope"));
    cr_assert_str_eq(safetensors_meta(&f, "fmt"), "pt");
    cr_assert_str_eq(safetensors_meta(&f, "k\xc3\xa9"), "v\n\"q\"");
    cr_assert_null(safetensors_meta(&f, "absent"));
    cr_assert_str_eq(f.path, p);
    close_good(&f, p);
}

Test(safetensors, escaped_and_unicode_names) {
    StFile f;
    char *p = open_good(&f, "{" T1("a\\\"b\\\\c\\/\\u00e9\\ud83d\\ude00\\t", "U8", "[1]", 0, 1) ","
                            T1("\xe6\x97\xa5\xf0\x9f\x98\x80", "U8", "[1]", 1, 2) "}", 2);
    cr_assert_str_eq(f.tensors[0].name, "a\"b\\c/\xc3\xa9\xf0\x9f\x98\x80\t");
    cr_assert_str_eq(f.tensors[1].name, "\xe6\x97\xa5\xf0\x9f\x98\x80");
    close_good(&f, p);
}

// ---------------------------------------------------------------------------------------------
// writer

// The reference crate's own serialization tests (tensor.rs test_serialization / test_empty):
// our writer must produce the same bytes for the same input.
Test(safetensors, writer_matches_reference_bytes) {
    char *dir = tmp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    float data[6] = {0, 1, 2, 3, 4, 5};
    StWriteTensor t = {.name = "attn.0", .dtype = DT_F32, .ndim = 3, .shape = {1, 2, 3}, .data = data};
    cr_assert_eq(safetensors_write(path, &t, 1, NULL, 0), ER_OK, "%s", er_last_error());
    static const unsigned char want[] = {
        64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100,
        116, 121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34,
        58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115,
        101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63,
        0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};
    size_t n;
    unsigned char *got = read_bytes(path, &n);
    cr_assert_eq(n, sizeof want);
    cr_assert_eq(memcmp(got, want, n), 0);
    free(got);

    cr_assert_eq(safetensors_write(path, NULL, 0, NULL, 0), ER_OK, "%s", er_last_error());
    static const unsigned char want_empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
    got = read_bytes(path, &n);
    cr_assert_eq(n, sizeof want_empty);
    cr_assert_eq(memcmp(got, want_empty, n), 0);
    free(got);

    const char *kv[] = {"framework", "pt"};
    cr_assert_eq(safetensors_write(path, NULL, 0, kv, 1), ER_OK, "%s", er_last_error());
    static const unsigned char want_meta[] = {
        40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95,
        95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112,
        116, 34, 125, 125, 32, 32, 32, 32, 32};
    got = read_bytes(path, &n);
    cr_assert_eq(n, sizeof want_meta);
    cr_assert_eq(memcmp(got, want_meta, n), 0);
    free(got);
    unlink(path);
    rmdir(dir);
    free(dir);
}

Test(safetensors, round_trip_all_dtypes) {
    char *dir = tmp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ErRng r;
    rng_seed(&r, 99);
    StWriteTensor t[DT_COUNT + 3];
    unsigned char *bufs[DT_COUNT + 3];
    char names[DT_COUNT + 3][32];
    int n = 0;
    for (int d = 0; d < DT_COUNT; d++, n++) {
        t[n] = (StWriteTensor){.dtype = (ErDType)d, .ndim = 1 + d % 3};
        for (int k = 0; k < t[n].ndim; k++)
            t[n].shape[k] = 1 + (d + 2 * k) % 5;
        snprintf(names[n], sizeof names[n], "layer.%d.%s", d, dtype_name((ErDType)d));
        t[n].name = names[n];
    }
    t[n++] = (StWriteTensor){.name = "scalar", .dtype = DT_F32, .ndim = 0};
    t[n++] = (StWriteTensor){.name = "empty", .dtype = DT_BF16, .ndim = 2, .shape = {0, 5}};
    t[n++] = (StWriteTensor){.name = "odd \"name\"\\\n\xc3\xa9", .dtype = DT_U8, .ndim = 1, .shape = {3}};
    for (int i = 0; i < n; i++) {
        size_t bytes = dtype_size(t[i].dtype);
        for (int k = 0; k < t[i].ndim; k++)
            bytes *= (size_t)t[i].shape[k];
        bufs[i] = malloc(bytes + 1);
        for (size_t b = 0; b < bytes; b++)
            bufs[i][b] = (unsigned char)rng_u64(&r);
        t[i].data = bytes ? bufs[i] : NULL;
    }
    const char *kv[] = {"format", "pt", "note", "h\xc3\xa9llo \"world\"\n\ttab"};
    cr_assert_eq(safetensors_write(path, t, n, kv, 2), ER_OK, "%s", er_last_error());
    cr_assert_eq(dir_entries(dir), 1, "temporary file left behind");

    StFile f;
    cr_assert_eq(safetensors_open(&f, path), ER_OK, "%s", er_last_error());
    uint64_t hlen = 0;
    memcpy(&hlen, f.map, 8);
    cr_assert_eq(hlen % 8, 0, "header not padded to 8");
    cr_assert_eq(((const char *)f.map)[8 + hlen - 1] == ' ' || ((const char *)f.map)[8 + hlen - 1] == '}', 1);
    cr_assert_eq(f.n_tensors, n);
    for (int i = 0; i < n; i++) {
        const StTensor *g = &f.tensors[i]; // file order == the order given to the writer
        cr_assert_str_eq(g->name, t[i].name);
        cr_assert_eq(g->dtype, t[i].dtype);
        cr_assert_eq(g->ndim, t[i].ndim);
        for (int k = 0; k < g->ndim; k++)
            cr_assert_eq(g->shape[k], t[i].shape[k]);
        cr_assert_eq((int64_t)g->nbytes, st_numel(g) * (int64_t)dtype_size(g->dtype));
        if (g->nbytes)
            cr_assert_eq(memcmp(g->data, bufs[i], g->nbytes), 0, "data of %s", g->name);
    }
    cr_assert_eq(((const char *)f.tensors[0].data - (const char *)f.map) % 8, 0, "data buffer not 8-aligned");
    cr_assert_eq(f.n_meta, 2);
    cr_assert_str_eq(safetensors_meta(&f, "format"), "pt");
    cr_assert_str_eq(safetensors_meta(&f, "note"), kv[3]);
    safetensors_close(&f);
    cr_assert_null(f.map);

    // overwriting replaces the file atomically
    cr_assert_eq(safetensors_write(path, t, 1, NULL, 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(safetensors_open(&f, path), ER_OK, "%s", er_last_error());
    cr_assert_eq(f.n_tensors, 1);
    cr_assert_eq(f.n_meta, 0);
    safetensors_close(&f);
    cr_assert_eq(dir_entries(dir), 1);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    unlink(path);
    rmdir(dir);
    free(dir);
}

// safetensors_read_tensor: the right dtype and shape is copied; a missing name, another dtype or
// another shape (same element count, other rank) is refused naming the file, the tensor and both sides.
Test(safetensors, read_tensor_checks_dtype_and_shape) {
    char *dir = tmp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float w[6] = {1, 2, 3, 4, 5, 6};
    int32_t ids[3] = {7, -8, 9};
    StWriteTensor t[2] = {{.name = "w", .dtype = DT_F32, .ndim = 2, .shape = {2, 3}, .data = w},
                          {.name = "ids", .dtype = DT_I32, .ndim = 1, .shape = {3}, .data = ids}};
    cr_assert_eq(safetensors_write(path, t, 2, NULL, 0), ER_OK, "%s", er_last_error());
    StFile f;
    cr_assert_eq(safetensors_open(&f, path), ER_OK, "%s", er_last_error());
    float wo[6] = {0};
    int32_t io[3] = {0};
    cr_assert_eq(safetensors_read_tensor(&f, "w", DT_F32, 2, (int64_t[]){2, 3}, wo), ER_OK, "%s", er_last_error());
    cr_assert_eq(memcmp(wo, w, sizeof w), 0);
    cr_assert_eq(safetensors_read_tensor(&f, "ids", DT_I32, 1, (int64_t[]){3}, io), ER_OK, "%s", er_last_error());
    cr_assert_eq(memcmp(io, ids, sizeof ids), 0);
    struct {
        const char *name;
        ErDType dt;
        int ndim;
        int64_t shape[2];
        const char *expect;
    } bad[] = {
        {"nope", DT_F32, 1, {3}, "tensor \"nope\" is missing"},
        {"ids", DT_F32, 1, {3}, "tensor \"ids\" is I32 of shape [3], expected F32 of shape [3]"},
        {"w", DT_F32, 1, {6}, "tensor \"w\" is F32 of shape [2,3], expected F32 of shape [6]"},
        {"w", DT_F32, 2, {3, 2}, "expected F32 of shape [3,2]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float out[6] = {0};
        cr_assert_eq(safetensors_read_tensor(&f, bad[i].name, bad[i].dt, bad[i].ndim, bad[i].shape, out), ER_EFORMAT);
        cr_assert_not_null(strstr(er_last_error(), bad[i].expect), "case %zu: %s", i, er_last_error());
        cr_assert_not_null(strstr(er_last_error(), path), "case %zu lacks the path: %s", i, er_last_error());
        cr_assert_eq(out[0], 0, "case %zu: nothing copied on refusal", i);
    }
    safetensors_close(&f);
    unlink(path);
    rmdir(dir);
    free(dir);
}

static void expect_write_error(const char *dir, const StWriteTensor *t, int n, const char *const *kv, int nm,
                               const char *keyword) {
    char path[256];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    int rc = safetensors_write(path, t, n, kv, nm);
    cr_assert_lt(rc, 0, "write should fail with \"%s\"", keyword);
    cr_assert_not_null(strstr(er_last_error(), keyword), "message lacks \"%s\": %s", keyword, er_last_error());
    cr_assert_not_null(strstr(er_last_error(), path), "message lacks the path: %s", er_last_error());
    cr_assert_eq(dir_entries(dir), 0, "a failed write left a file behind");
}

Test(safetensors, writer_refuses_bad_input) {
    char *dir = tmp_dir();
    float x[4] = {0};
    StWriteTensor ok = {.name = "w", .dtype = DT_F32, .ndim = 1, .shape = {4}, .data = x};
    StWriteTensor t[2] = {ok, ok};
    expect_write_error(dir, t, 2, NULL, 0, "duplicate tensor name \"w\"");
    t[0].name = t[1].name = "x\ny";
    expect_write_error(dir, t, 2, NULL, 0, "duplicate tensor name \"x?y\"");
    t[0].name = "w";
    t[1].name = "v";
    t[1].ndim = ST_MAX_DIMS + 1;
    expect_write_error(dir, t, 2, NULL, 0, "ndim 9");
    t[1].ndim = -1;
    expect_write_error(dir, t, 2, NULL, 0, "ndim -1");
    t[1] = ok;
    t[1].name = "v";
    t[1].shape[0] = -4;
    expect_write_error(dir, t, 2, NULL, 0, "negative dimension");
    t[1] = ok;
    t[1].name = "v";
    t[1].data = NULL;
    expect_write_error(dir, t, 2, NULL, 0, "data is NULL");
    t[1] = ok;
    t[1].name = NULL;
    expect_write_error(dir, t, 2, NULL, 0, "tensor name is NULL");
    t[1].name = "__metadata__";
    expect_write_error(dir, t, 2, NULL, 0, "__metadata__");
    t[1].name = "bad\xff";
    expect_write_error(dir, t, 2, NULL, 0, "not valid UTF-8");
    t[1] = ok;
    t[1].name = "v";
    t[1].dtype = DT_COUNT;
    expect_write_error(dir, t, 2, NULL, 0, "invalid dtype");
    t[1] = ok;
    t[1].name = "v";
    t[1].ndim = 2;
    t[1].shape[0] = INT64_MAX;
    t[1].shape[1] = INT64_MAX;
    expect_write_error(dir, t, 2, NULL, 0, "overflows");
    t[1].shape[0] = 0; // empty, but the reader refuses dimensions from 2^53 on
    t[1].shape[1] = (int64_t)1 << 53;
    expect_write_error(dir, t, 2, NULL, 0, "out of range");
    const char *kv_dup[] = {"a", "1", "a", "2"};
    expect_write_error(dir, &ok, 1, kv_dup, 2, "duplicate metadata key \"a\"");
    const char *kv_null[] = {"a", NULL};
    expect_write_error(dir, &ok, 1, kv_null, 1, "metadata value is NULL");
    expect_write_error(dir, &ok, -1, NULL, 0, "bad tensor list");
    expect_write_error(dir, NULL, 1, NULL, 0, "bad tensor list");
    expect_write_error(dir, &ok, 1, NULL, 1, "bad metadata list");
    // a directory that does not exist: I/O error naming it, nothing created
    char path[256];
    snprintf(path, sizeof path, "%s/missing/x.safetensors", dir);
    cr_assert_eq(safetensors_write(path, &ok, 1, NULL, 0), ER_EIO);
    cr_assert_not_null(strstr(er_last_error(), "missing/x.safetensors"), "%s", er_last_error());
    cr_assert_eq(dir_entries(dir), 0);
    rmdir(dir);
    free(dir);
}

// ---------------------------------------------------------------------------------------------
// a file written by Python with only json + struct (numpy fp16 / torch bf16 when present)

static const char *py_writer =
    "import json, random, struct, sys\n"
    "out = sys.argv[1]\n"
    "random.seed(7)\n"
    "vals = [random.gauss(0, 1) * 10 ** random.randint(-9, 5) for _ in range(20000)]\n"
    "vals += [65504.0, 65519.0, 65520.0, 1e-8, 2**-25, 1.5 * 2**-24, -0.0, 1 + 2**-11, 1 + 3 * 2**-11,\n"
    "         1 + 2**-8, 1 + 3 * 2**-8, 3e38, -1e-40]\n"
    "f32 = struct.pack('<%df' % len(vals), *vals)\n"
    "ts = [('src', 'F32', [len(vals)], f32)]\n"
    "have = []\n"
    "try:\n"
    "    import numpy as np\n"
    "    a = np.frombuffer(f32, dtype='<f4')\n"
    "    with np.errstate(over='ignore'):\n"
    "        ts.append(('np_f16', 'F16', [len(vals)], a.astype('<f2').tobytes()))\n"
    "    have.append('numpy')\n"
    "except ImportError:\n"
    "    pass\n"
    "try:\n"
    "    import torch\n"
    "    t = torch.frombuffer(bytearray(f32), dtype=torch.float32).to(torch.bfloat16)\n"
    "    ts.append(('torch_bf16', 'BF16', [len(vals)], t.view(torch.int16).numpy().tobytes()))\n"
    "    have.append('torch')\n"
    "except ImportError:\n"
    "    pass\n"
    "ts.append(('ints', 'I32', [2, 3], struct.pack('<6i', -3, -2, -1, 0, 1, 2**31 - 1)))\n"
    "ts.append(('bytes', 'U8', [3], bytes([0, 128, 255])))\n"
    "ts.append(('scalar', 'I8', [], struct.pack('<b', -5)))\n"
    "ts.append(('empty', 'F32', [0, 4], b''))\n"
    "ts.append(('i64', 'I64', [1], struct.pack('<q', -2)))\n"
    "head = {'__metadata__': {'format': 'pt', 'have': ','.join(have), 'note': 'h\\u00e9llo \"q\"'}}\n"
    "off, data = 0, b''\n"
    "for name, dt, shape, b in ts:\n"
    "    head[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(b)]}\n"
    "    off += len(b)\n"
    "    data += b\n"
    "# keys in reverse offset order, default separators, ASCII escapes, no padding\n"
    "h = json.dumps(dict(reversed(list(head.items())))).encode()\n"
    "open(out, 'wb').write(struct.pack('<Q', len(h)) + h + data)\n";

// Tensor `name` (what Python's `lib` made of v as 16-bit floats) against ours, bit for bit; a warning
// when the writer had no `lib` (the tensor is then absent).
static void expect_same_16bit(const StFile *f, const char *name, uint16_t (*ours)(float), const float *v, int64_t n,
                              const char *lib, const char *kind) {
    const StTensor *t = safetensors_find(f, name);
    if (!t) {
        cr_log_warn("%s missing: %s conversions NOT cross-checked against %s", lib, kind, lib);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint16_t want;
        memcpy(&want, (const char *)t->data + 2 * i, 2);
        cr_assert_eq(ours(v[i]), want, "%s %s of %.9g: 0x%04x, ours 0x%04x", lib, kind, v[i], want, ours(v[i]));
    }
}

Test(safetensors, reads_file_written_by_python) {
    if (access("/usr/bin/python3", X_OK) != 0)
        cr_skip_test("SKIPPED: /usr/bin/python3 is missing, so the Python cross-check cannot run");
    char *script = tmp_file();
    write_bytes(script, py_writer, strlen(py_writer));
    char *path = tmp_file();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s", script, path);
    int st = system(cmd);
    unlink(script);
    free(script);
    cr_assert_eq(st, 0, "python writer failed (%d)", st);

    StFile f;
    cr_assert_eq(safetensors_open(&f, path), ER_OK, "%s", er_last_error());
    cr_assert_str_eq(safetensors_meta(&f, "format"), "pt");
    cr_assert_str_eq(safetensors_meta(&f, "note"), "h\xc3\xa9llo \"q\"");
    cr_assert_str_eq(f.tensors[0].name, "src"); // offset order, though the JSON lists it last
    const StTensor *src = safetensors_find(&f, "src");
    int64_t n = st_numel(src);
    cr_assert_gt(n, 20000);
    float *v = malloc((size_t)n * sizeof *v);
    cr_assert_eq(dtype_to_f32(v, src->data, DT_F32, (size_t)n), ER_OK);

    const StTensor *ints = safetensors_find(&f, "ints");
    cr_assert_not_null(ints);
    float iv[6];
    cr_assert_eq(dtype_to_f32(iv, ints->data, DT_I32, 6), ER_OK);
    cr_assert(iv[0] == -3 && iv[4] == 1 && iv[5] == 2147483648.0f);
    const StTensor *u8 = safetensors_find(&f, "bytes");
    cr_assert_eq(((const unsigned char *)u8->data)[1], 128);
    const StTensor *sc = safetensors_find(&f, "scalar");
    cr_assert_eq(sc->ndim, 0);
    cr_assert_eq(*(const int8_t *)sc->data, -5);
    cr_assert_eq(safetensors_find(&f, "empty")->nbytes, 0);
    cr_assert_eq(safetensors_find(&f, "i64")->dtype, DT_I64);

    const char *have = safetensors_meta(&f, "have");
    expect_same_16bit(&f, "np_f16", f32_to_f16, v, n, "numpy", "fp16");
    expect_same_16bit(&f, "torch_bf16", f32_to_bf16, v, n, "torch", "bf16");
    cr_log_info("python cross-check ran with: %s", have && *have ? have : "stdlib only");
    free(v);
    safetensors_close(&f);
    unlink(path);
    free(path);
}
