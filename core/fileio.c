#include "core/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
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

// How an output path is written (the table in fileio.h).
enum { OUT_REPLACE, OUT_IN_PLACE, OUT_STDOUT };

static const char *kind_name(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket" : S_ISBLK(m) ? "a block device" : "not a regular file";
}

// The directory part of path ("." for a bare name; "/" for "/x"), as a new string.
static char *dir_part(const char *path) {
    char *copy = er_strdup(path), *d = copy ? er_strdup(dirname(copy)) : NULL;
    free(copy);
    return d;
}

// A new file can be made in path's directory: it exists, is a directory, and may be written.
static int check_parent(const char *path, const char *shown) {
    char *d = dir_part(path);
    if (!d)
        return er_error(ER_ENOMEM, "out of memory");
    struct stat st;
    int rc = ER_OK;
    if (stat(d, &st) != 0)
        rc = er_error(ER_EIO, "%s: cannot create: %s: %s", shown, d, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        rc = er_error(ER_EIO, "%s: cannot create: %s is not a directory", shown, d);
    else if (access(d, W_OK | X_OK) != 0)
        rc = er_error(ER_EIO, "%s: cannot create: %s: %s", shown, d, strerror(errno));
    free(d);
    return rc;
}

// *kind for path; *target (new string, OUT_REPLACE only) is the file to rename over: path, or a link's target.
static int output_kind(const char *path, int *kind, char **target) {
    *target = NULL;
    if (strcmp(path, "-") == 0) {
        *kind = OUT_STDOUT;
        return ER_OK;
    }
    if (!path[0])
        return er_error(ER_EINVAL, "empty output path");
    struct stat st;
    int link = 0;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT)
            return er_error(ER_EIO, "%s: cannot write: %s", path, strerror(errno));
        ER_TRY(check_parent(path, path));
        *kind = OUT_REPLACE;
        return (*target = er_strdup(path)) ? ER_OK : er_error(ER_ENOMEM, "out of memory");
    }
    if (S_ISLNK(st.st_mode)) {
        link = 1;
        if (stat(path, &st) != 0)
            return er_error(ER_EIO, "%s: is a symbolic link to nothing (%s): write to its target's path, or remove "
                            "the link", path, strerror(errno));
    }
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        *kind = OUT_IN_PLACE;
        return ER_OK;
    }
    if (!S_ISREG(st.st_mode))
        return er_error(ER_EIO, "%s: is %s%s (expected a file path to write)", path, link ? "a link to " : "",
                        kind_name(st.st_mode));
    *kind = OUT_REPLACE;
    *target = link ? realpath(path, NULL) : er_strdup(path);
    if (!*target)
        return er_error(ER_EIO, "%s: cannot resolve the link: %s", path, strerror(errno));
    int rc = check_parent(*target, path);
    if (rc < 0) {
        free(*target);
        *target = NULL;
    }
    return rc;
}

int file_output_check(const char *path) {
    int kind;
    char *target;
    ER_TRY(output_kind(path, &kind, &target));
    free(target);
    return ER_OK;
}

int atomic_open(AtomicFile *af, const char *path) {
    memset(af, 0, sizeof *af);
    int kind, rc = ER_OK;
    ER_TRY(output_kind(path, &kind, &af->target));
    af->path = er_strdup(kind == OUT_STDOUT ? "stdout" : path);
    if (!af->path)
        ER_CHECK(er_error(ER_ENOMEM, "out of memory"));
    if (kind == OUT_STDOUT) {
        int fd = dup(STDOUT_FILENO);
        if (fd < 0 || !(af->fp = fdopen(fd, "wb"))) {
            if (fd >= 0)
                close(fd);
            ER_CHECK(er_error(ER_EIO, "stdout: cannot write: %s", strerror(errno)));
        }
    } else if (kind == OUT_IN_PLACE) { // a fifo blocks here until a reader opens it
        if (!(af->fp = fopen(path, "wb")))
            ER_CHECK(er_error(ER_EIO, "%s: cannot open for writing: %s", path, strerror(errno)));
    } else {
        size_t n = strlen(af->target) + 32;
        if (!(af->tmp_path = malloc(n)))
            ER_CHECK(er_error(ER_ENOMEM, "out of memory"));
        snprintf(af->tmp_path, n, "%s.tmp.%ld", af->target, (long)getpid());
        if (!(af->fp = fopen(af->tmp_path, "wb")))
            ER_CHECK(er_error(ER_EIO, "%s: cannot create: %s", path, strerror(errno)));
    }
done:
    if (rc < 0) { // nothing was created: the caller's atomic_abort has nothing left to free
        free(af->path);
        free(af->target);
        free(af->tmp_path);
        memset(af, 0, sizeof *af);
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

static void atomic_release(AtomicFile *af) {
    free(af->path);
    free(af->target);
    free(af->tmp_path);
    memset(af, 0, sizeof *af);
}

int atomic_commit(AtomicFile *af) {
    int rc = ER_OK;
    FILE *fp = af->fp; // closed in all cases
    af->fp = NULL;
    errno = 0;
    // Written in place: nothing to fsync (a pipe or a device) or rename, but a full disk still fails here.
    if (fflush(fp) != 0 || ferror(fp) || (af->tmp_path && fsync(fileno(fp)) != 0)) {
        rc = er_error(ER_EIO, "%s: write failed: %s", af->path, errno ? strerror(errno) : "I/O error");
        fclose(fp);
        goto done;
    }
    if (fclose(fp) != 0) {
        rc = er_error(ER_EIO, "%s: close failed: %s", af->path, strerror(errno));
        goto done;
    }
    if (!af->tmp_path)
        goto done;
    if (rename(af->tmp_path, af->target) != 0) {
        rc = er_error(ER_EIO, "%s: rename failed: %s", af->path, strerror(errno));
        goto done;
    }
    fsync_parent_dir(af->target);
done:
    if (rc < 0 && af->tmp_path)
        unlink(af->tmp_path);
    atomic_release(af);
    return rc;
}

void atomic_abort(AtomicFile *af) {
    if (af->fp)
        fclose(af->fp);
    if (af->tmp_path)
        unlink(af->tmp_path);
    atomic_release(af);
}

int file_write_atomic(const char *path, const void *data, size_t len) {
    AtomicFile af;
    ER_TRY(atomic_open(&af, path));
    if (len && fwrite(data, 1, len, af.fp) != len) {
        int rc = er_error(ER_EIO, "%s: write failed: %s", af.path, strerror(errno));
        atomic_abort(&af);
        return rc;
    }
    return atomic_commit(&af);
}

int path_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int file_output_not_input(const char *out, const char *in, const char *flag) {
    if (!out || !in || strcmp(out, "-") == 0 || strcmp(in, "-") == 0)
        return ER_OK;
    if (path_same_file(out, in))
        return er_error(ER_EINVAL, "%s: is the same file as %s %s: it would be overwritten (write the output "
                        "elsewhere)", out, flag, in);
    struct stat st;
    if (stat(in, &st) != 0 || !S_ISDIR(st.st_mode) || !(ends_with(out, ".json") || ends_with(out, ".safetensors")))
        return ER_OK;
    char *d = dir_part(out);
    int same = d && path_same_file(d, in);
    free(d);
    if (same && path_exists(out))
        return er_error(ER_EINVAL, "%s: is a file of %s %s: it would be overwritten (write the output elsewhere)",
                        out, flag, in);
    return ER_OK;
}

int dir_output_not_input(const char *out_dir, const char *in, const char *flag) {
    if (!out_dir || !in || strcmp(in, "-") == 0 || !path_exists(out_dir) || !path_exists(in))
        return ER_OK;
    if (path_same_file(out_dir, in))
        return er_error(ER_EINVAL, "%s: is %s %s itself: the output would overwrite it (choose another output dir)",
                        out_dir, flag, in);
    char *ro = realpath(out_dir, NULL), *ri = realpath(in, NULL);
    size_t n = ro ? strlen(ro) : 0;
    int inside = ro && ri && strncmp(ri, ro, n) == 0 && (ri[n] == '/' || (n == 1 && ro[0] == '/'));
    free(ro);
    free(ri);
    if (inside)
        return er_error(ER_EINVAL, "%s: holds %s %s: the run writes into this dir (move the input, or choose another "
                        "output dir)", out_dir, flag, in);
    return ER_OK;
}

int dir_output_check(const char *path) {
    struct stat st;
    if (!path[0])
        return er_error(ER_EINVAL, "empty output directory path");
    if (lstat(path, &st) == 0) {
        if (S_ISLNK(st.st_mode) && stat(path, &st) != 0)
            return er_error(ER_EIO, "%s: is a symbolic link to nothing (%s): make its target, or remove the link",
                            path, strerror(errno));
        if (!S_ISDIR(st.st_mode))
            return er_error(ER_EIO, "%s exists and is not a directory", path);
        if (access(path, W_OK | X_OK) != 0)
            return er_error(ER_EIO, "%s: cannot write into it: %s", path, strerror(errno));
        return ER_OK;
    }
    if (errno != ENOENT && errno != ENOTDIR)
        return er_error(ER_EIO, "%s: cannot create: %s", path, strerror(errno));
    // Absent: dir_make creates the missing levels below the nearest one that exists (a file there: refused).
    char *p = er_strdup(path);
    if (!p)
        return er_error(ER_ENOMEM, "out of memory");
    int rc = ER_OK;
    for (;;) {
        char *d = er_strdup(dirname(p));
        free(p);
        p = d;
        if (!p)
            return er_error(ER_ENOMEM, "out of memory");
        if (stat(p, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                rc = er_error(ER_EIO, "%s: cannot create: %s is not a directory", path, p);
            else if (access(p, W_OK | X_OK) != 0)
                rc = er_error(ER_EIO, "%s: cannot create: %s: %s", path, p, strerror(errno));
            break;
        }
        if (errno != ENOENT && errno != ENOTDIR) {
            rc = er_error(ER_EIO, "%s: cannot create: %s: %s", path, p, strerror(errno));
            break;
        }
        if (strcmp(p, ".") == 0 || strcmp(p, "/") == 0)
            break;
    }
    free(p);
    return rc;
}

int path_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? ER_OK : er_error(ER_EIO, "%s: cannot remove: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return er_error(ER_EIO, "%s: cannot remove: %s", path, strerror(errno));
        struct dirent *e;
        int rc = ER_OK;
        while (rc == ER_OK && (e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char *c = path_join(path, e->d_name);
            rc = c ? path_remove_tree(c) : ER_ENOMEM;
            free(c);
        }
        closedir(d);
        ER_TRY(rc);
        if (rmdir(path) != 0)
            return er_error(ER_EIO, "%s: cannot remove: %s", path, strerror(errno));
        return ER_OK;
    }
    if (unlink(path) != 0)
        return er_error(ER_EIO, "%s: cannot remove: %s", path, strerror(errno));
    return ER_OK;
}

// The dir an output dir is renamed onto: the path, or where an existing one resolves to (a link's target:
// the link is kept; "." or "out/" by their full names).
static char *stage_target(const char *dir) {
    struct stat st;
    if (lstat(dir, &st) == 0) {
        char *r = realpath(dir, NULL);
        if (!r)
            er_error(ER_EIO, "%s: cannot resolve the path: %s", dir, strerror(errno));
        return r;
    }
    char *s = er_strdup(dir);
    size_t n = s ? strlen(s) : 0;
    while (n > 1 && s[n - 1] == '/') // "out/" renames onto "out"
        s[--n] = 0;
    if (!s)
        er_error(ER_ENOMEM, "out of memory");
    return s;
}

int dir_stage_open(const char *dir, char **stage) {
    *stage = NULL;
    ER_TRY(dir_output_check(dir));
    char *t = stage_target(dir);
    if (!t)
        return er_last_status();
    size_t n = strlen(t) + 32;
    char *s = malloc(n);
    int rc = ER_OK;
    if (!s)
        ER_CHECK(er_error(ER_ENOMEM, "out of memory"));
    snprintf(s, n, "%s.tmp-%ld", t, (long)getpid());
    ER_CHECK(path_remove_tree(s)); // a leftover of an earlier process with this pid
    ER_CHECK(dir_make(s));
    *stage = s;
    s = NULL;
done:
    free(s);
    free(t);
    return rc;
}

int dir_stage_commit(char *stage, const char *dir) {
    char *t = stage_target(dir);
    int rc = ER_OK;
    if (!t)
        ER_CHECK(er_last_status());
    char *slash = strrchr(t, '/');
    if (slash && slash != t) { // the levels above: the staging dir is their child, so they exist already
        *slash = 0;
        ER_CHECK(dir_make(t));
        *slash = '/';
    }
    if (rename(stage, t) != 0)
        ER_CHECK(er_error(ER_EIO, "%s: cannot move the finished output into place: %s", dir,
                          errno == ENOTEMPTY || errno == EEXIST ? "it is not empty any more" : strerror(errno)));
    fsync_parent_dir(t);
done:
    if (rc < 0)
        path_remove_tree(stage);
    free(t);
    free(stage);
    return rc;
}

void dir_stage_abort(char *stage) {
    if (!stage)
        return;
    int rc = path_remove_tree(stage);
    (void)rc; // a failure keeps the error it was called after
    free(stage);
}

int dir_stage_move_into(char *stage, const char *dir) {
    DIR *d = NULL;
    int rc = ER_OK;
    ER_CHECK(dir_make(dir));
    if (!(d = opendir(stage)))
        ER_CHECK(er_error(ER_EIO, "%s: cannot read: %s", stage, strerror(errno)));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *from = path_join(stage, e->d_name), *to = path_join(dir, e->d_name);
        int bad = !from || !to || rename(from, to) != 0;
        if (bad)
            rc = from && to ? er_error(ER_EIO, "%s: cannot move into %s: %s", from, dir, strerror(errno)) : ER_ENOMEM;
        free(from);
        free(to);
        ER_CHECK(rc);
    }
    char *dot = path_join(dir, "."); // fsync_parent_dir of dir/. syncs dir itself
    if (dot)
        fsync_parent_dir(dot);
    free(dot);
done:
    if (d)
        closedir(d);
    path_remove_tree(stage);
    free(stage);
    return rc;
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
    size_t a = strlen(dir);
    while (a > 1 && dir[a - 1] == '/' && dir[a - 2] == '/') // "runs//" + "x": one slash between
        a--;
    while (*name == '/' && a && dir[a - 1] == '/')
        name++;
    size_t b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) {
        er_error(ER_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(s, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/' && *name != '/')
        s[k++] = '/';
    memcpy(s + k, name, b + 1);
    return s;
}

int file_fingerprint(const char *path, char *out, size_t out_n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return er_error(ER_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char buf[1 << 14];
    uint64_t h = 0xcbf29ce484222325ull, bytes = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < n; i++)
            h = (h ^ buf[i]) * 0x100000001b3ull;
        bytes += n;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return er_error(ER_EIO, "%s: read error while fingerprinting it", path);
    snprintf(out, out_n, "%llu:%016llx", (unsigned long long)bytes, (unsigned long long)h);
    return ER_OK;
}

int path_dir_len(const char *dir) {
    size_t n = strlen(dir);
    while (n > 0 && dir[n - 1] == '/')
        n--;
    return (int)n;
}

char *path_resolve(const char *path) {
    char *r = realpath(path, NULL);
    return r ? r : er_strdup(path);
}
