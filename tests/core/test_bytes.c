// Byte ranges (core/bytes.h), what the safetensors and GGUF readers parse: a range of an fd at an offset
// that is not a page boundary, the fd's own position left alone and the fd left open; pipes read to their
// end or for a length; closed fds, directories, devices and ranges past the end refused with one line
// naming the fd; buffers copied or borrowed; and the readers on such ranges naming them in their messages.
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/safetensors.h"

// A failed call: the status, and a message holding each of the given parts.
static void expect_error(int rc, int status, const char *a, const char *b) {
    cr_assert_eq(rc, status, "status %d (%s), expected %d; message \"%s\"", rc, er_status_name(rc), status,
                 er_last_error());
    cr_assert(strstr(er_last_error(), a) && (!b || strstr(er_last_error(), b)), "message \"%s\" lacks \"%s\"/\"%s\"",
              er_last_error(), a, b ? b : "");
    cr_assert_null(strchr(er_last_error(), '\n'), "message on more than one line: \"%s\"", er_last_error());
}

// A file /tmp/er_bytes_<pid>_<tag> of n bytes, byte i = (i * 7 + 3) & 255; its open fd.
static int pattern_file(const char *tag, size_t n, char *path, size_t cap) {
    snprintf(path, cap, "/tmp/er_bytes_%d_%s", (int)getpid(), tag);
    unsigned char *buf = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)((i * 7 + 3) & 255);
    cr_assert_eq(file_write_atomic(path, buf, n), ER_OK, "%s", er_last_error());
    free(buf);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    return fd;
}

static void expect_pattern(const ByteRange *r, size_t from, size_t n) {
    cr_assert_eq(r->size, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(r->data[i], (unsigned char)(((from + i) * 7 + 3) & 255), "byte %zu", i);
}

Test(bytes, fd_range_at_any_offset_leaves_the_fd_alone) {
    char path[256];
    size_t n = 3 * 4096 + 123;
    int fd = pattern_file("range", n, path, sizeof path);
    cr_assert_eq(lseek(fd, 1000, SEEK_SET), 1000);
    const uint64_t offsets[] = {0, 1, 4095, 4096, 5001, n};
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        uint64_t off = offsets[k];
        ByteRange r;
        cr_assert_eq(bytes_from_fd(&r, fd, off, BYTES_TO_END), ER_OK, "%s", er_last_error());
        expect_pattern(&r, off, n - off);
        char name[32];
        snprintf(name, sizeof name, "fd %d", fd);
        cr_assert_str_eq(r.name, name);
        bytes_free(&r);
        if (off + 100 <= n) {
            cr_assert_eq(bytes_from_fd(&r, fd, off, 100), ER_OK, "%s", er_last_error());
            expect_pattern(&r, off, 100);
            bytes_free(&r);
        }
    }
    cr_assert_eq(lseek(fd, 0, SEEK_CUR), 1000, "the fd's position moved");
    cr_assert_neq(fcntl(fd, F_GETFD), -1, "the fd was closed");
    close(fd);
    unlink(path);
}

Test(bytes, bad_fds_and_ranges_are_refused_naming_the_fd) {
    char path[256], name[32];
    int fd = pattern_file("bad", 5000, path, sizeof path);
    snprintf(name, sizeof name, "fd %d", fd);
    ByteRange r;
    expect_error(bytes_from_fd(&r, fd, 5001, BYTES_TO_END), ER_ERANGE, name, "past the end");
    expect_error(bytes_from_fd(&r, fd, 4000, 1001), ER_ERANGE, name, "run past the end");
    expect_error(bytes_from_fd(&r, fd, 1, UINT64_MAX - 1), ER_ERANGE, name, "run past the end");
    cr_assert_null(r.data);
    close(fd);
    unlink(path);
    // The fd is closed now: EBADF.
    expect_error(bytes_from_fd(&r, fd, 0, BYTES_TO_END), ER_EIO, name, strerror(EBADF));
    expect_error(bytes_from_fd(&r, -1, 0, BYTES_TO_END), ER_EINVAL, "fd -1", "not a file descriptor");
    int dir = open("/tmp", O_RDONLY | O_DIRECTORY);
    cr_assert_geq(dir, 0);
    snprintf(name, sizeof name, "fd %d", dir);
    expect_error(bytes_from_fd(&r, dir, 0, BYTES_TO_END), ER_EIO, name, "a directory");
    close(dir);
    int dev = open("/dev/zero", O_RDONLY);
    cr_assert_geq(dev, 0);
    snprintf(name, sizeof name, "fd %d", dev);
    expect_error(bytes_from_fd(&r, dev, 0, BYTES_TO_END), ER_EIO, name, "a device");
    close(dev);
}

typedef struct {
    int fd;
    size_t n;
} Writer;

static void *write_pattern(void *arg) {
    Writer *w = arg;
    unsigned char buf[1000];
    for (size_t at = 0; at < w->n;) {
        size_t k = w->n - at < sizeof buf ? w->n - at : sizeof buf;
        for (size_t i = 0; i < k; i++)
            buf[i] = (unsigned char)(((at + i) * 7 + 3) & 255);
        ssize_t put = write(w->fd, buf, k);
        if (put <= 0)
            break; // the reader left: it read what it asked for
        at += (size_t)put;
    }
    close(w->fd);
    return NULL;
}

// A pipe fed by a thread with n pattern bytes; the read end.
static int pattern_pipe(pthread_t *th, Writer *w, size_t n) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    *w = (Writer){p[1], n};
    cr_assert_eq(pthread_create(th, NULL, write_pattern, w), 0);
    return p[0];
}

Test(bytes, pipes_are_read_to_their_end_or_for_a_length) {
    signal(SIGPIPE, SIG_IGN); // the writer learns that the reader left from EPIPE
    pthread_t th;
    Writer w;
    ByteRange r;
    size_t n = 300000; // more than a pipe holds: the reader grows its buffer as bytes come
    int fd = pattern_pipe(&th, &w, n);
    cr_assert_eq(bytes_from_fd(&r, fd, 0, BYTES_TO_END), ER_OK, "%s", er_last_error());
    expect_pattern(&r, 0, n);
    bytes_free(&r);
    pthread_join(th, NULL);
    close(fd);

    fd = pattern_pipe(&th, &w, n);
    cr_assert_eq(bytes_from_fd(&r, fd, 0, 70000), ER_OK, "%s", er_last_error());
    expect_pattern(&r, 0, 70000);
    bytes_free(&r);
    cr_assert_eq(bytes_from_fd(&r, fd, 0, 1000), ER_OK, "%s", er_last_error()); // read on from where it stood
    expect_pattern(&r, 70000, 1000);
    bytes_free(&r);
    close(fd); // the writer stops at EPIPE
    pthread_join(th, NULL);

    char name[32];
    fd = pattern_pipe(&th, &w, 5000);
    snprintf(name, sizeof name, "fd %d", fd);
    expect_error(bytes_from_fd(&r, fd, 10, BYTES_TO_END), ER_EINVAL, name, "offset must be 0");
    // A length the stream does not have: refused once it ends, the buffer never sized from the length.
    expect_error(bytes_from_fd(&r, fd, 0, (uint64_t)1 << 50), ER_EIO, name, "ended after 5000 of");
    pthread_join(th, NULL);
    close(fd);
}

Test(bytes, buffers_are_copied_or_borrowed) {
    char src[] = "0123456789";
    ByteRange c, b, e;
    cr_assert_eq(bytes_from_buffer(&c, src, 10, "<buffer>", 0), ER_OK);
    cr_assert_eq(bytes_from_buffer(&b, src, 10, "<buffer>", 1), ER_OK);
    cr_assert_eq(bytes_from_buffer(&e, src, 0, "<buffer>", 1), ER_OK);
    cr_assert_neq((const void *)c.data, (const void *)src);
    cr_assert_eq((const void *)b.data, (const void *)src);
    src[0] = 'x';
    cr_assert_eq(c.data[0], '0', "the copy changed with its source");
    cr_assert_eq(b.data[0], 'x');
    cr_assert(bytes_borrows(&b, src + 9) && !bytes_borrows(&b, src + 10) && !bytes_borrows(&c, c.data));
    cr_assert(e.data && e.size == 0 && !e.borrowed && !bytes_borrows(&e, src));
    cr_assert_str_eq(c.name, "<buffer>");
    bytes_free(&c);
    bytes_free(&b);
    bytes_free(&e);
    bytes_free(&e); // zeroed: a no-op
}

// Every prefix of a small safetensors file and of a GGUF, each in a heap block of exactly its length (so
// ASan sees a read past it), is refused naming "<buffer>"; the whole opens (a GGUF also without the padding
// after its last tensor).
Test(bytes, readers_refuse_every_truncated_buffer_by_name) {
    char st_path[256], gg_path[256];
    snprintf(st_path, sizeof st_path, "/tmp/er_bytes_%d.safetensors", (int)getpid());
    snprintf(gg_path, sizeof gg_path, "/tmp/er_bytes_%d.gguf", (int)getpid());
    float v[6] = {1, 2, 3, 4, 5, 6};
    StWriteTensor t = {"w", DT_F32, 2, {2, 3}, v};
    cr_assert_eq(safetensors_write(st_path, &t, 1, NULL, 0), ER_OK, "%s", er_last_error());
    GgufWriter w = {0};
    uint64_t ne[2] = {3, 2};
    cr_assert_eq(gguf_set_str(&w, "general.architecture", "qwen2"), ER_OK);
    cr_assert_eq(gguf_add_tensor(&w, "w", GGML_F32, 2, ne, v, sizeof v), ER_OK);
    cr_assert_eq(gguf_write(&w, gg_path), ER_OK, "%s", er_last_error());
    gguf_writer_free(&w);
    const char *paths[2] = {st_path, gg_path};
    for (int k = 0; k < 2; k++) {
        char *all;
        size_t n, need;
        cr_assert_eq(file_read_all(paths[k], 1 << 20, &all, &n), ER_OK);
        GgufFile whole;
        cr_assert_eq(gguf_open(&whole, gg_path), ER_OK, "%s", er_last_error());
        need = k == 0 ? n : (size_t)((const char *)whole.tensors[0].data + sizeof v - (const char *)whole.map);
        gguf_close(&whole);
        cr_assert_leq(need, n);
        for (size_t len = 0; len <= n; len++) {
            unsigned char *exact = malloc(len ? len : 1);
            memcpy(exact, all, len);
            ByteRange r;
            cr_assert_eq(bytes_from_buffer(&r, exact, len, "<buffer>", 1), ER_OK);
            StFile sf;
            GgufFile gf;
            int rc = k == 0 ? safetensors_open_bytes(&sf, &r) : gguf_open_bytes(&gf, &r);
            cr_assert_null(r.data, "the reader did not take the bytes over");
            if (len >= need) {
                cr_assert_eq(rc, ER_OK, "%s prefix %zu: %s", paths[k], len, er_last_error());
                const void *data = k == 0 ? safetensors_find(&sf, "w")->data : gguf_find_tensor(&gf, "w")->data;
                cr_assert_eq(memcmp(data, v, sizeof v), 0);
                if (k == 0)
                    safetensors_close(&sf);
                else
                    gguf_close(&gf);
            } else {
                cr_assert_eq(rc, ER_EFORMAT, "%s prefix %zu: status %d, %s", paths[k], len, rc, er_last_error());
                cr_assert(strncmp(er_last_error(), "<buffer>: ", 10) == 0, "%s", er_last_error());
            }
            free(exact);
        }
        er_free(all);
        unlink(paths[k]);
    }
}
