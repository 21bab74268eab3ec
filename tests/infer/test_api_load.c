// Loading a model without a path (infer/erinfer.h: er_model_load_from_buffer, er_model_load_from_fd): the
// tiny base as a GGUF and as its safetensors file with config.json and tokenizer.json passed as buffers,
// from a buffer (copied, or borrowed at an odd address) and from an fd (whole, inside a bigger file at an
// offset that is not a multiple of anything, with its position moved, closed after the call, a pipe)
// generates the tokens the path-loaded model does. Bad input (truncated and lying files, empty buffers,
// closed fds, directories, NULLs, a wrong size field) is an error status with one line naming the source.
#include <criterion/criterion.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "infer/erinfer.h"
#include "model/model.h"
#include "tests/common/api_helpers.h"
#include "tests/common/helpers.h"
#include "train/gguf_export.h"
#include "train/quantize.h"

#define TINY "models/tiny-base"

static char *tmp;     // per test: a temp dir
static char *gguf;    // tmp/tiny.gguf, the tiny base exported f32

static void setup(void) {
    threads_set(2);
    tmp = helper_tmpdir("er_api_load_");
    gguf = path_join(tmp, "tiny.gguf");
    cr_assert_eq(gguf_export_model(TINY, gguf, "f32", NULL), ER_OK, "%s", er_last_error());
}

static void teardown(void) {
    helper_rmdir(tmp);
    er_free(gguf);
    er_free(tmp);
}

TestSuite(api_load, .init = setup, .fini = teardown);

// A file's bytes in a malloc block of exactly its size (so ASan sees a read past the end).
static unsigned char *slurp(const char *path, size_t *n) {
    char *all;
    cr_assert_eq(file_read_all(path, 64u << 20, &all, n), ER_OK, "%s", er_last_error());
    unsigned char *exact = malloc(*n ? *n : 1);
    cr_assert_not_null(exact);
    memcpy(exact, all, *n);
    er_free(all);
    return exact;
}

// What a model generates: a greedy chat reply (the chat template and the end token count) and two sampled
// raw continuations.
typedef struct {
    int n[3], finish[3];
    int tokens[3][48];
} Gen;

static Gen generate(ErModel *m) {
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 2, 256, 0), ER_OK, "%s", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 48;
    ErMessage msg = {"user", "Start with 3. Add 4. Multiply by 2. What is the result?"};
    Gen g;
    memset(&g, 0, sizeof g);
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    for (int call = 0; call < 2; call++) {
        for (int i = 0; i < er_result_count(s); i++) {
            const ErSample *x = er_result_sample(s, i);
            int k = call == 0 ? 0 : 1 + i;
            g.n[k] = x->n_tokens;
            g.finish[k] = x->finish;
            memcpy(g.tokens[k], x->tokens, (size_t)x->n_tokens * sizeof(int));
        }
        if (call == 0) {
            p.temperature = 0.8f;
            p.n_samples = 2;
            p.seed = 5;
            p.max_new_tokens = 24;
            cr_assert_eq(er_generate_raw(s, "Start with 5. Subtract 2.", &p, NULL, NULL), ER_OK, "%s",
                         er_last_error());
        }
    }
    er_session_free(s);
    cr_assert_gt(g.n[0], 0);
    return g;
}

static void expect_same(const Gen *a, const Gen *b, const char *what) {
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(a->n[k], b->n[k], "%s: generation %d has %d tokens, the path-loaded model's %d", what, k,
                     b->n[k], a->n[k]);
        cr_assert_eq(a->finish[k], b->finish[k], "%s: generation %d ends otherwise", what, k);
        cr_assert_eq(memcmp(a->tokens[k], b->tokens[k], (size_t)a->n[k] * sizeof(int)), 0,
                     "%s: generation %d has other tokens than the path-loaded model's", what, k);
    }
}

// Loads with `load` (ER_OK expected), generates, frees, and compares with ref.
#define EXPECT_LOADS_AS(ref, what, call)                                                          \
    do {                                                                                          \
        ErModel *m_ = (ErModel *)0x1;                                                             \
        int rc_ = (call);                                                                         \
        cr_assert_eq(rc_, ER_OK, "%s: %s", what, er_last_error());                                \
        Gen g_ = generate(m_);                                                                    \
        er_model_free(m_);                                                                        \
        expect_same(ref, &g_, what);                                                              \
    } while (0)

// A file at path holding pad bytes of junk, then n bytes of data, then 1000 bytes of junk; its open fd.
static int embed_file(const char *name, const void *data, size_t n, size_t pad) {
    char *path = path_join(tmp, name);
    unsigned char *buf = malloc(pad + n + 1000);
    memset(buf, 0xA5, pad + n + 1000);
    memcpy(buf + pad, data, n);
    cr_assert_eq(file_write_atomic(path, buf, pad + n + 1000), ER_OK, "%s", er_last_error());
    free(buf);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    er_free(path);
    return fd;
}

Test(api_load, gguf_from_a_buffer_or_an_fd_generates_as_from_its_path) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, gguf), ER_OK, "%s", er_last_error());
    Gen ref = generate(m);
    er_model_free(m);
    size_t n;
    unsigned char *bytes = slurp(gguf, &n);
    EXPECT_LOADS_AS(&ref, "copied buffer", er_model_load_from_buffer(&m_, bytes, n, NULL));
    ErModelSource src;
    er_model_source_init(&src);
    src.flags = ER_MODEL_SOURCE_BORROW;
    EXPECT_LOADS_AS(&ref, "borrowed buffer", er_model_load_from_buffer(&m_, bytes, n, &src));
    // At an odd address every tensor is misaligned for its type: those used in place are copied.
    unsigned char *odd = malloc(n + 1);
    memcpy(odd + 1, bytes, n);
    EXPECT_LOADS_AS(&ref, "borrowed buffer at an odd address", er_model_load_from_buffer(&m_, odd + 1, n, &src));
    free(odd);

    int fd = open(gguf, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(lseek(fd, 777, SEEK_SET), 777);
    EXPECT_LOADS_AS(&ref, "whole fd", er_model_load_from_fd(&m_, fd, 0, -1, NULL));
    EXPECT_LOADS_AS(&ref, "fd with its length", er_model_load_from_fd(&m_, fd, 0, (int64_t)n, NULL));
    cr_assert_eq(lseek(fd, 0, SEEK_CUR), 777, "the fd's position moved");
    // Closed right after the call: the model keeps its mapping.
    ErModel *kept;
    cr_assert_eq(er_model_load_from_fd(&kept, fd, 0, -1, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(close(fd), 0, "the library closed the fd");
    Gen after_close = generate(kept);
    er_model_free(kept);
    expect_same(&ref, &after_close, "fd closed after the call");
    // Inside a bigger file (an asset in an APK): at 4096 + 3, and at a page boundary.
    const size_t pads[2] = {4096 + 3, 8192};
    for (int k = 0; k < 2; k++) {
        fd = embed_file(k ? "apk_aligned" : "apk_odd", bytes, n, pads[k]);
        EXPECT_LOADS_AS(&ref, "fd range inside a bigger file", er_model_load_from_fd(&m_, fd, (int64_t)pads[k],
                                                                                     (int64_t)n, NULL));
        close(fd);
    }
    free(bytes);
}

Test(api_load, safetensors_with_json_buffers_generates_as_from_its_dir) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, TINY), ER_OK, "%s", er_last_error());
    Gen ref = generate(m);
    er_model_free(m);
    size_t n, nc, nt, ntc;
    unsigned char *bytes = slurp(TINY "/model.safetensors", &n), *cfg = slurp(TINY "/config.json", &nc);
    unsigned char *tj = slurp(TINY "/tokenizer.json", &nt), *tc = slurp(TINY "/tokenizer_config.json", &ntc);
    ErModelSource src;
    er_model_source_init(&src);
    src.config_json = (ErBuffer){cfg, nc};
    src.tokenizer_json = (ErBuffer){tj, nt};
    src.tokenizer_config_json = (ErBuffer){tc, ntc};
    EXPECT_LOADS_AS(&ref, "copied buffer", er_model_load_from_buffer(&m_, bytes, n, &src));
    int fd = embed_file("st_odd", bytes, n, 5);
    EXPECT_LOADS_AS(&ref, "fd range", er_model_load_from_fd(&m_, fd, 5, (int64_t)n, &src));
    close(fd);
    src.flags = ER_MODEL_SOURCE_BORROW;
    EXPECT_LOADS_AS(&ref, "borrowed buffer", er_model_load_from_buffer(&m_, bytes, n, &src));
    // The same GGUF tokenizer replaced by these buffers: the same tokens.
    size_t ng;
    unsigned char *g = slurp(gguf, &ng);
    src.config_json = (ErBuffer){NULL, 0};
    EXPECT_LOADS_AS(&ref, "GGUF with tokenizer buffers", er_model_load_from_buffer(&m_, g, ng, &src));
    free(g);
    free(bytes);
    free(cfg);
    free(tj);
    free(tc);
}

// The copy is the model's own: the caller's buffer is scribbled over and freed before generating. A
// borrowed buffer is never written, also where tiling for the decode kernels (the AVX512-VNNI kernels) copies
// the q4 matrices: the pages it leaves would be released, which for a caller's anonymous memory zeroes it.
Test(api_load, copied_buffer_is_free_to_go_and_borrowed_one_is_never_written) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, gguf), ER_OK, "%s", er_last_error());
    Gen ref = generate(m);
    er_model_free(m);
    size_t n;
    unsigned char *bytes = slurp(gguf, &n);
    cr_assert_eq(er_model_load_from_buffer(&m, bytes, n, NULL), ER_OK, "%s", er_last_error());
    memset(bytes, 0x7F, n);
    free(bytes);
    Gen g = generate(m);
    er_model_free(m);
    expect_same(&ref, &g, "copied buffer freed by the caller");

    // A q4 model dir: its matrices are the ones tiling copies.
    Model fm;
    cr_assert_eq(model_load(&fm, TINY, MODEL_LOAD_TRAINABLE), ER_OK, "%s", er_last_error());
    QuantizeOptions o = {.weights = "q4"};
    QuantizeReport rep;
    cr_assert_eq(quantize_model(&fm, &o, NULL, NULL, &rep), ER_OK, "%s", er_last_error());
    char *q4 = path_join(tmp, "q4");
    cr_assert_eq(model_save(&fm, q4, 0), ER_OK, "%s", er_last_error());
    model_free(&fm);
    helper_copy_file(TINY "/tokenizer.json", q4, "tokenizer.json");
    helper_copy_file(TINY "/tokenizer_config.json", q4, "tokenizer_config.json");
    cr_assert_eq(er_model_load(&m, q4), ER_OK, "%s", er_last_error());
    ref = generate(m);
    er_model_free(m);
    char *st = path_join(q4, "model.safetensors"), *cj = path_join(q4, "config.json");
    size_t nc, nt, ntc;
    unsigned char *cfg = slurp(cj, &nc), *tj = slurp(TINY "/tokenizer.json", &nt);
    unsigned char *tc = slurp(TINY "/tokenizer_config.json", &ntc), *orig = slurp(st, &n);
    // Anonymous pages of its own (a malloc block this size is mapped), as an app's buffer would be.
    bytes = malloc(n);
    memcpy(bytes, orig, n);
    ErModelSource src;
    er_model_source_init(&src);
    src.flags = ER_MODEL_SOURCE_BORROW;
    src.config_json = (ErBuffer){cfg, nc};
    src.tokenizer_json = (ErBuffer){tj, nt};
    src.tokenizer_config_json = (ErBuffer){tc, ntc};
    cr_assert_eq(er_model_load_from_buffer(&m, bytes, n, &src), ER_OK, "%s", er_last_error());
    g = generate(m);
    cr_assert_eq(memcmp(bytes, orig, n), 0, "the borrowed buffer changed");
    er_model_free(m);
    expect_same(&ref, &g, "borrowed q4 buffer");
    free(bytes);
    free(orig);
    free(cfg);
    free(tj);
    free(tc);
    er_free(st);
    er_free(cj);
    er_free(q4);
}

typedef struct {
    int fd;
    const unsigned char *data;
    size_t n;
} PipeFeed;

static void *feed(void *arg) {
    PipeFeed *p = arg;
    for (size_t at = 0; at < p->n;) {
        ssize_t k = write(p->fd, p->data + at, p->n - at);
        if (k <= 0)
            break;
        at += (size_t)k;
    }
    close(p->fd);
    return NULL;
}

// A content URI served through a pipe: read to its end (or for a length), offset 0 only.
Test(api_load, gguf_from_a_pipe_generates_as_from_its_path) {
    signal(SIGPIPE, SIG_IGN);
    ErModel *m;
    cr_assert_eq(er_model_load(&m, gguf), ER_OK, "%s", er_last_error());
    Gen ref = generate(m);
    er_model_free(m);
    size_t n;
    unsigned char *bytes = slurp(gguf, &n);
    for (int bounded = 0; bounded < 2; bounded++) {
        int p[2];
        cr_assert_eq(pipe(p), 0);
        PipeFeed f = {p[1], bytes, n};
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, feed, &f), 0);
        EXPECT_LOADS_AS(&ref, "pipe", er_model_load_from_fd(&m_, p[0], 0, bounded ? (int64_t)n : -1, NULL));
        pthread_join(th, NULL);
        close(p[0]);
    }
    free(bytes);
}

// A refusal: a negative status, *out NULL, and one line holding `a` (and `b`).
#define EXPECT_REFUSED(call, a, b)                                                                              \
    do {                                                                                                        \
        ErModel *m_ = (ErModel *)0x1;                                                                           \
        int rc_ = (call);                                                                                       \
        cr_assert_lt(rc_, 0, "accepted: %s", #call);                                                            \
        cr_assert_null(m_, "*out not NULL after a refusal: %s", #call);                                         \
        const char *e_ = er_last_error();                                                                       \
        cr_assert(strstr(e_, a) && strstr(e_, b), "%s: message \"%s\" lacks \"%s\" / \"%s\"", #call, e_, a, b); \
        cr_assert_null(strchr(e_, '\n'), "%s: message on two lines: \"%s\"", #call, e_);                        \
    } while (0)

Test(api_load, bad_arguments_are_refused_in_one_line) {
    size_t n;
    unsigned char *bytes = slurp(gguf, &n);
    const char *buf_fn = "er_model_load_from_buffer", *fd_fn = "er_model_load_from_fd";
    cr_assert_lt(er_model_load_from_buffer(NULL, bytes, n, NULL), 0);
    cr_assert(strstr(er_last_error(), buf_fn) && strstr(er_last_error(), "NULL"), "%s", er_last_error());
    cr_assert_lt(er_model_load_from_fd(NULL, 0, 0, -1, NULL), 0);
    cr_assert(strstr(er_last_error(), fd_fn) && strstr(er_last_error(), "NULL"), "%s", er_last_error());
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, NULL, n, NULL), buf_fn, "NULL");
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, 0, NULL), "<buffer>", "empty");
    er_model_source_init(NULL); // a no-op

    // The size field: never set, another version's (smaller or larger), and the flags.
    ErModelSource src;
    memset(&src, 0, sizeof src);
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, &src), "ErModelSource.size is 0", "er_model_source_init");
    struct {
        ErModelSource s;
        char newer[64];
    } big;
    memset(&big, 0, sizeof big);
    big.s.size = sizeof big;
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, &big.s), "ErModelSource.size", "er_model_source_init");
    er_model_source_init(&src);
    src.size -= sizeof(ErBuffer);
    EXPECT_REFUSED(er_model_load_from_fd(&m_, 0, 0, -1, &src), fd_fn, "ErModelSource.size");
    er_model_source_init(&src);
    src.flags = 0x10;
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, &src), "flags 0x10", "does not know");
    er_model_source_init(&src);
    src.tokenizer_json = (ErBuffer){NULL, 12};
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, &src), "ErModelSource.tokenizer_json.data is NULL", "12");

    // What a format takes: a GGUF holds its config; the configs go with a tokenizer; safetensors need both.
    er_model_source_init(&src);
    src.config_json = (ErBuffer){"{}", 2};
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, &src), "<buffer>: a GGUF file", "<config_json>");
    er_model_source_init(&src);
    src.tokenizer_config_json = (ErBuffer){"{}", 2};
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, &src), "<tokenizer_config_json> is read with",
                   "<tokenizer_json>");
    size_t ns;
    unsigned char *st = slurp(TINY "/model.safetensors", &ns);
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, st, ns, NULL), "<buffer>: not a GGUF file", "<config_json>");
    er_model_source_init(&src);
    src.config_json = (ErBuffer){"{}", 2};
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, st, ns, &src), "<buffer>: a safetensors file needs",
                   "<tokenizer_json>");
    // Texts that are not what they should be, named by their field.
    src.tokenizer_json = (ErBuffer){"{}", 2};
    src.config_json = (ErBuffer){"{\"hidden_size\": ", 16};
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, st, ns, &src), "<config_json>: ", "not valid JSON");
    size_t nc;
    unsigned char *cfg = slurp(TINY "/config.json", &nc);
    src.config_json = (ErBuffer){cfg, nc};
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, st, ns, &src), "<tokenizer_json>: ", "");

    // fds: a closed one (EBADF), a directory, negative offsets and lengths, a range past the end.
    int fd = open(gguf, O_RDONLY);
    char name[32];
    snprintf(name, sizeof name, "fd %d", fd);
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, -1, -1, NULL), fd_fn, "offset -1");
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, 0, -2, NULL), fd_fn, "length -2");
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, (int64_t)n + 1, -1, NULL), name, "past the end");
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, 1, (int64_t)n, NULL), name, "run past the end");
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, (int64_t)n, -1, NULL), name, "empty");
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, 1, -1, NULL), name, "not a GGUF file");
    close(fd);
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, 0, -1, NULL), name, "Bad file descriptor");
    int dir = open(tmp, O_RDONLY | O_DIRECTORY);
    snprintf(name, sizeof name, "fd %d", dir);
    EXPECT_REFUSED(er_model_load_from_fd(&m_, dir, 0, -1, NULL), name, "a directory");
    close(dir);
    free(cfg);
    free(st);
    free(bytes);
}

// Loads prefix [0, len) of data from an exact-size copy (borrowed, so ASan sees any read past it); a
// refusal naming "<buffer>" expected.
static void expect_prefix_refused(const unsigned char *data, size_t len, const ErModelSource *src) {
    unsigned char *exact = malloc(len ? len : 1);
    memcpy(exact, data, len);
    ErModelSource s = *src;
    s.flags = ER_MODEL_SOURCE_BORROW;
    ErModel *m = (ErModel *)0x1;
    int rc = er_model_load_from_buffer(&m, exact, len, &s);
    cr_assert_lt(rc, 0, "a prefix of %zu bytes loaded", len);
    cr_assert_null(m);
    cr_assert(strncmp(er_last_error(), "<buffer>: ", 10) == 0, "prefix %zu: \"%s\"", len, er_last_error());
    cr_assert_null(strchr(er_last_error(), '\n'));
    free(exact);
}

// Cut points: every byte of the first 64, a stride through the header, and around each tensor's data.
Test(api_load, truncated_files_are_refused) {
    size_t n;
    unsigned char *bytes = slurp(gguf, &n);
    GgufFile f;
    cr_assert_eq(gguf_open(&f, gguf), ER_OK, "%s", er_last_error());
    size_t first = n, end = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        size_t at = (size_t)((const char *)f.tensors[i].data - (const char *)f.map);
        first = at < first ? at : first;
        end = at + f.tensors[i].nbytes > end ? at + f.tensors[i].nbytes : end;
    }
    ErModelSource none;
    er_model_source_init(&none);
    for (size_t len = 0; len < 64; len++)
        expect_prefix_refused(bytes, len, &none);
    for (size_t len = 64; len < first; len += 97)
        expect_prefix_refused(bytes, len, &none);
    for (int i = 0; i < f.n_tensors; i++) {
        size_t at = (size_t)((const char *)f.tensors[i].data - (const char *)f.map), e = at + f.tensors[i].nbytes;
        const size_t cuts[4] = {at, at + 1, e - 1, e};
        for (int k = 0; k < 4; k++)
            if (cuts[k] < end)
                expect_prefix_refused(bytes, cuts[k], &none);
    }
    gguf_close(&f);

    size_t ns, nc, nt;
    unsigned char *st = slurp(TINY "/model.safetensors", &ns), *cfg = slurp(TINY "/config.json", &nc);
    unsigned char *tj = slurp(TINY "/tokenizer.json", &nt);
    ErModelSource src;
    er_model_source_init(&src);
    src.config_json = (ErBuffer){cfg, nc};
    src.tokenizer_json = (ErBuffer){tj, nt};
    uint64_t hlen;
    memcpy(&hlen, st, 8);
    const size_t cuts[] = {0, 1, 7, 8, 9, 8 + hlen / 2, 8 + hlen - 1, 8 + hlen, 8 + hlen + 1, ns / 2, ns - 4, ns - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++)
        expect_prefix_refused(st, cuts[k], &src);
    free(st);
    free(cfg);
    free(tj);
    free(bytes);
}

// The u64 at the first occurrence of `after` (a tensor name) + skip bytes in data: where a field of it sits.
static size_t field_at(const unsigned char *data, size_t n, const char *after, size_t skip) {
    size_t k = strlen(after);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(data + i, after, k) == 0)
            return i + k + skip;
    cr_assert_fail("\"%s\" not found", after);
    return 0;
}

// Headers that lie, as a buffer and as an fd: refused naming the source, before anything is sized from them.
Test(api_load, lying_headers_are_refused) {
    size_t n;
    unsigned char *bytes = slurp(gguf, &n);
    // output_norm.weight: u32 n_dims (1), u64 ne[0], u32 type, then its u64 offset: far past the end.
    size_t off = field_at(bytes, n, "output_norm.weight", 4 + 8 + 4);
    uint64_t was, lie = (uint64_t)1 << 40;
    memcpy(&was, bytes + off, 8);
    memcpy(bytes + off, &lie, 8);
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, NULL), "<buffer>: tensor \"output_norm.weight\"",
                   "lies outside the file");
    int fd = embed_file("lying.gguf", bytes, n, 0);
    char name[32];
    snprintf(name, sizeof name, "fd %d: ", fd);
    EXPECT_REFUSED(er_model_load_from_fd(&m_, fd, 0, -1, NULL), name, "lies outside the file");
    close(fd);
    memcpy(bytes + off, &was, 8);
    memcpy(bytes + 16, &lie, 8); // the key count
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, bytes, n, NULL), "<buffer>: claims", "keys");

    size_t ns, nc, nt;
    unsigned char *st = slurp(TINY "/model.safetensors", &ns), *cfg = slurp(TINY "/config.json", &nc);
    unsigned char *tj = slurp(TINY "/tokenizer.json", &nt);
    ErModelSource src;
    er_model_source_init(&src);
    src.config_json = (ErBuffer){cfg, nc};
    src.tokenizer_json = (ErBuffer){tj, nt};
    uint64_t hlen;
    memcpy(&hlen, st, 8);
    memcpy(st, &lie, 8);
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, st, ns, &src), "<buffer>: header length", "");
    memcpy(st, &hlen, 8);
    // The last tensor's data_offsets end pushed 4 bytes past the buffer (as many digits: the header keeps
    // its length).
    char *text = malloc(hlen + 1);
    memcpy(text, st + 8, hlen);
    text[hlen] = 0;
    char end_str[32];
    snprintf(end_str, sizeof end_str, "%llu]", (unsigned long long)(ns - 8 - hlen));
    char *at = strstr(text, end_str);
    cr_assert_not_null(at, "the last data_offsets end %s is not in the header", end_str);
    char longer[32];
    snprintf(longer, sizeof longer, "%llu]", (unsigned long long)(ns - 8 - hlen + 4));
    cr_assert_eq(strlen(longer), strlen(end_str));
    memcpy(st + 8 + (size_t)(at - text), longer, strlen(longer));
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, st, ns, &src), "<buffer>: ", "data_offsets");
    free(text);
    // A config that lies about the layers: refused naming the config's buffer, nothing sized from it.
    free(st);
    st = slurp(TINY "/model.safetensors", &ns);
    const char *lying_cfg = "{\"model_type\": \"qwen2\", \"hidden_size\": 128, \"intermediate_size\": 384, "
                            "\"num_hidden_layers\": 16777216, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                            "\"vocab_size\": 512, \"max_position_embeddings\": 2048, \"tie_word_embeddings\": true}";
    src.config_json = (ErBuffer){lying_cfg, strlen(lying_cfg)};
    EXPECT_REFUSED(er_model_load_from_buffer(&m_, st, ns, &src), "<config_json>: num_hidden_layers is 16777216",
                   "4 layers");
    free(st);
    free(cfg);
    free(tj);
    free(bytes);
}
