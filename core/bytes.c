// Byte ranges for the file readers: files and fds mapped (or read), buffers copied or borrowed.
#include "core/bytes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

static const unsigned char EMPTY[1] = {0}; // an empty range's data: never NULL

static int set_name(ByteRange *r, const char *name) {
    if (!(r->name = er_strdup(name)))
        return er_error(ER_ENOMEM, "%s: out of memory", name);
    return ER_OK;
}

// length bytes at offset of the regular file fd by pread, into a block of ours: where mapping fails.
static int read_at(ByteRange *r, int fd, uint64_t offset, size_t length, int map_errno) {
    unsigned char *buf = er_alloc(length);
    if (!buf)
        return er_error(ER_ENOMEM, "%s: cannot map (%s), and no memory to read its %zu bytes", r->name,
                        strerror(map_errno), length);
    size_t n = 0;
    while (n < length) {
        ssize_t k = pread(fd, buf + n, length - n, (off_t)(offset + n));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            int e = errno;
            er_free(buf);
            if (k == 0) // the file shrank since fstat
                return er_error(ER_EIO, "%s: the file ended after %zu of %zu bytes", r->name, n, length);
            return er_error(ER_EIO, "%s: cannot read: %s", r->name, strerror(e));
        }
        n += (size_t)k;
    }
    r->data = r->owned = buf;
    r->size = length;
    return ER_OK;
}

// length bytes at offset of the regular file fd: mapped from the page that holds offset, else read.
static int map_at(ByteRange *r, int fd, uint64_t offset, uint64_t length) {
    if (length > SIZE_MAX / 2 || offset > (uint64_t)INT64_MAX)
        return er_error(ER_EUNSUPPORTED, "%s: %llu bytes at offset %llu are too many to map on this machine", r->name,
                        (unsigned long long)length, (unsigned long long)offset);
    if (length == 0) {
        r->data = EMPTY;
        return ER_OK;
    }
    long ps = sysconf(_SC_PAGESIZE);
    uint64_t lead = ps > 0 ? offset % (uint64_t)ps : 0;
    size_t len = (size_t)(lead + length);
    void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, (off_t)(offset - lead));
    if (p == MAP_FAILED)
        return read_at(r, fd, offset, (size_t)length, errno);
    r->map = p;
    r->map_len = len;
    r->data = (const unsigned char *)p + lead;
    r->size = (size_t)length;
    return ER_OK;
}

int bytes_map_file(ByteRange *r, const char *path) {
    memset(r, 0, sizeof *r);
    if (!path)
        return er_error(ER_EINVAL, "bytes_map_file: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return er_error(ER_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = ER_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        ER_CHECK(er_error(ER_EIO, "%s: not a regular file", path));
    ER_CHECK(set_name(r, path));
    ER_CHECK(map_at(r, fd, 0, (uint64_t)st.st_size));
done:
    close(fd); // the mapping keeps the file alive
    if (rc < 0)
        bytes_free(r);
    return rc;
}

// A pipe or socket from where it stands to its end (or length bytes), the buffer grown as bytes come: a
// length that lies costs nothing until the bytes are there.
static int read_stream(ByteRange *r, int fd, uint64_t length) {
    int bounded = length != BYTES_TO_END;
    size_t mem = er_physical_memory(), limit = bounded ? (size_t)length : mem ? mem : SIZE_MAX / 4;
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;
    int rc = ER_OK;
    for (;;) {
        if (n == cap) {
            if (n > limit || (bounded && n == limit))
                break;
            size_t want = cap ? cap * 2 : (size_t)1 << 16;
            want = want > limit + !bounded ? limit + !bounded : want; // unbounded: one byte more shows a stream
            unsigned char *p = er_realloc_array(buf, want ? want : 1, 1); // too long for the machine
            if (!p)
                ER_CHECK(er_error(ER_ENOMEM, "%s: out of memory after reading %zu bytes", r->name, n));
            buf = p;
            cap = want;
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            ER_CHECK(er_error(ER_EIO, "%s: cannot read: %s", r->name, strerror(errno)));
        if (k == 0)
            break;
        n += (size_t)k;
    }
    if (!bounded && n > limit)
        ER_CHECK(er_error(ER_ENOMEM, "%s: the stream holds more than this machine's %zu bytes of memory", r->name,
                          limit));
    if (bounded && n < limit)
        ER_CHECK(er_error(ER_EIO, "%s: the stream ended after %zu of the %llu bytes asked for", r->name, n,
                          (unsigned long long)length));
    r->data = n ? buf : EMPTY;
    r->owned = buf;
    r->size = n;
    buf = NULL;
done:
    er_free(buf);
    return rc;
}

int bytes_from_fd(ByteRange *r, int fd, uint64_t offset, uint64_t length) {
    memset(r, 0, sizeof *r);
    char name[32];
    snprintf(name, sizeof name, "fd %d", fd);
    int rc = ER_OK;
    struct stat st;
    ER_CHECK(set_name(r, name));
    if (fd < 0)
        ER_CHECK(er_error(ER_EINVAL, "%s: not a file descriptor", name));
    if (fstat(fd, &st) != 0)
        ER_CHECK(er_error(ER_EIO, "%s: cannot read: %s", name, strerror(errno)));
    if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
        if (offset != 0)
            ER_CHECK(er_error(ER_EINVAL, "%s: a pipe or socket is read from where it stands: offset must be 0, not "
                              "%llu", name, (unsigned long long)offset));
        if (length != BYTES_TO_END && length > SIZE_MAX / 2)
            ER_CHECK(er_error(ER_ERANGE, "%s: length %llu is more than this machine can hold", name,
                              (unsigned long long)length));
        ER_CHECK(read_stream(r, fd, length));
        goto done;
    }
    if (!S_ISREG(st.st_mode))
        ER_CHECK(er_error(ER_EIO, "%s: %s, not a file, pipe or socket", name,
                          S_ISDIR(st.st_mode) ? "a directory" : "a device"));
    uint64_t size = (uint64_t)st.st_size;
    if (offset > size)
        ER_CHECK(er_error(ER_ERANGE, "%s: offset %llu is past the end of the file (%llu bytes)", name,
                          (unsigned long long)offset, (unsigned long long)size));
    if (length == BYTES_TO_END)
        length = size - offset;
    else if (length > size - offset)
        ER_CHECK(er_error(ER_ERANGE, "%s: %llu bytes at offset %llu run past the end of the file (%llu bytes)", name,
                          (unsigned long long)length, (unsigned long long)offset, (unsigned long long)size));
    ER_CHECK(map_at(r, fd, offset, length));
done:
    if (rc < 0)
        bytes_free(r);
    return rc;
}

int bytes_from_buffer(ByteRange *r, const void *data, size_t size, const char *name, int borrow) {
    memset(r, 0, sizeof *r);
    ER_TRY(set_name(r, name));
    r->size = size;
    r->borrowed = borrow && size;
    if (size == 0)
        r->data = EMPTY;
    else if (borrow)
        r->data = data;
    else if ((r->owned = er_alloc(size)) != NULL)
        r->data = memcpy(r->owned, data, size);
    else {
        bytes_free(r);
        return er_error(ER_ENOMEM, "%s: out of memory copying its %zu bytes", name, size);
    }
    return ER_OK;
}

void bytes_move(ByteRange *to, ByteRange *from) {
    *to = *from;
    memset(from, 0, sizeof *from);
}

int bytes_borrows(const ByteRange *r, const void *p) {
    const unsigned char *c = p;
    return r->borrowed && c >= r->data && c < r->data + r->size;
}

void bytes_free(ByteRange *r) {
    if (!r)
        return;
    if (r->map)
        munmap(r->map, r->map_len);
    er_free(r->owned);
    er_free(r->name);
    memset(r, 0, sizeof *r);
}
