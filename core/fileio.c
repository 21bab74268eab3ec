#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return er_error(ER_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0;
    int rc = ER_OK;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = er_error(ER_EIO, "%s: not a regular file", path);
        goto done;
    }
    if ((size_t)st.st_size > max_bytes) {
        rc = er_error(ER_ERANGE, "%s: file is %lld bytes, more than the %zu allowed", path, (long long)st.st_size,
                      max_bytes);
        goto done;
    }
    n = (size_t)st.st_size;
    if (!(buf = er_alloc(n + 1))) {
        rc = ER_ENOMEM;
        goto done;
    }
    if (n && fread(buf, 1, n, fp) != n) {
        rc = er_error(ER_EIO, "%s: read failed", path);
        goto done;
    }
    buf[n] = 0;
    *out = buf;
    buf = NULL;
    if (out_len)
        *out_len = n;
done:
    er_free(buf);
    fclose(fp);
    return rc;
}

int atomic_open(AtomicFile *af, const char *path) {
    memset(af, 0, sizeof *af);
    // Refused now, not at the rename after all the work: a directory in the way.
    if (path_is_dir(path))
        return er_error(ER_EIO, "%s: is a directory (expected a file path to write)", path);
    size_t n = strlen(path) + 32;
    int rc = ER_OK;
    af->path = er_strdup(path);
    af->tmp_path = malloc(n);
    if (!af->path || !af->tmp_path)
        ER_CHECK(er_error(ER_ENOMEM, "out of memory"));
    snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    af->fp = fopen(af->tmp_path, "wb");
    if (!af->fp)
        ER_CHECK(er_error(ER_EIO, "%s: cannot create: %s", path, strerror(errno)));
done:
    if (rc < 0) { // nothing was created: the caller's atomic_abort has nothing left to free
        free(af->path);
        free(af->tmp_path);
        af->path = af->tmp_path = NULL;
    }
    return rc;
}

static void fsync_parent_dir(const char *path) {
    char *copy = er_strdup(path);
    if (!copy)
        return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

int atomic_commit(AtomicFile *af) {
    int rc = ER_OK;
    FILE *fp = af->fp; // closed in all cases
    af->fp = NULL;
    if (fflush(fp) != 0 || ferror(fp) || fsync(fileno(fp)) != 0) {
        rc = er_error(ER_EIO, "%s: write failed: %s", af->path, strerror(errno));
        fclose(fp);
        goto done;
    }
    if (fclose(fp) != 0) {
        rc = er_error(ER_EIO, "%s: close failed: %s", af->path, strerror(errno));
        goto done;
    }
    if (rename(af->tmp_path, af->path) != 0) {
        rc = er_error(ER_EIO, "%s: rename failed: %s", af->path, strerror(errno));
        goto done;
    }
    fsync_parent_dir(af->path);
done:
    if (rc < 0)
        unlink(af->tmp_path);
    free(af->path);
    free(af->tmp_path);
    af->path = af->tmp_path = NULL;
    return rc;
}

void atomic_abort(AtomicFile *af) {
    if (af->fp)
        fclose(af->fp);
    if (af->tmp_path)
        unlink(af->tmp_path);
    free(af->path);
    free(af->tmp_path);
    memset(af, 0, sizeof *af);
}

int file_write_atomic(const char *path, const void *data, size_t len) {
    AtomicFile af;
    ER_TRY(atomic_open(&af, path));
    if (len && fwrite(data, 1, len, af.fp) != len) {
        atomic_abort(&af);
        return er_error(ER_EIO, "%s: write failed", path);
    }
    return atomic_commit(&af);
}

int dir_make(const char *path) {
    if (!path[0]) // the loop below starts at path + 1
        return er_error(ER_EINVAL, "dir_make: empty path");
    char *p = er_strdup(path);
    if (!p)
        return ER_ENOMEM;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                int rc = er_error(ER_EIO, "%s: cannot create directory: %s", p, strerror(errno));
                free(p);
                return rc;
            }
            *s = c;
            if (!c)
                break;
        }
    }
    free(p);
    if (!path_is_dir(path))
        return er_error(ER_EIO, "%s: exists and is not a directory", path);
    return ER_OK;
}

int path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) {
        er_error(ER_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(s, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/')
        s[k++] = '/';
    memcpy(s + k, name, b + 1);
    return s;
}

char *path_resolve(const char *path) {
    char *r = realpath(path, NULL);
    return r ? r : er_strdup(path);
}
