// Status codes and the last-error message (stb style, but thread-local and never aborting).
// Library code returns a negative ErStatus and records one line naming the file, the field and
// what was expected; CLIs print er_last_error() and exit non-zero.
#ifndef CORE_ERROR_H
#define CORE_ERROR_H

// Every status: enumerator, value, er_status_name's text. infer/erinfer.h repeats the enum for users of
// the public header alone (whichever header comes first defines it); infer/api.c asserts at compile
// time that its values are these.
#define ER_STATUS_LIST(X)                                                               \
    X(ER_OK, 0, "ok")                                                                   \
    X(ER_EINVAL, -1, "invalid argument")    /* bad argument or value */                 \
    X(ER_EIO, -2, "I/O error")              /* open/read/write failed */                \
    X(ER_ENOMEM, -3, "out of memory")       /* allocation failed or would not fit */    \
    X(ER_EFORMAT, -4, "bad format")         /* malformed file contents */               \
    X(ER_EUNSUPPORTED, -5, "unsupported")   /* valid but not supported by this build */ \
    X(ER_ERANGE, -6, "out of range")        /* value out of range */                    \
    X(ER_EABORTED, -7, "aborted")           /* stopped by the caller (an abort callback) */

#ifndef ER_STATUS_DEFINED
#define ER_STATUS_DEFINED
#define ER_STATUS_ENUM_(name, value, text) name = value,
typedef enum { ER_STATUS_LIST(ER_STATUS_ENUM_) } ErStatus;
#undef ER_STATUS_ENUM_
#endif

// Records a printf-style message and returns `status` so callers can write
// `return er_error(ER_EFORMAT, "%s: header is not JSON", path);`
int er_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Puts a printf-style context and ": " in front of the last message (or of status's name when there
// is none) and returns `status`: `return er_error_prefix(rc, "%s:%ld", path, line);`
int er_error_prefix(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int er_last_status(void);
void er_clear_error(void);
// Also public (infer/erinfer.h declares them with ER_API): exported from a shared build with
// -fvisibility=hidden too.
__attribute__((visibility("default"))) const char *er_last_error(void);
__attribute__((visibility("default"))) const char *er_status_name(int status);

// One error style (docs/design.md, Conventions):
// - straight-line code that owns nothing propagates a negative status with ER_TRY;
// - a function that owns resources has one `int rc = ER_OK;`, one `done:` label that frees them all
//   (every *_free is safe on a zeroed struct, so cleanup needs no flags) and ER_CHECK in between.

// Returns a negative status from an expression.
#define ER_TRY(expr)               \
    do {                           \
        int er_try_rc_ = (expr);   \
        if (er_try_rc_ < 0)        \
            return er_try_rc_;     \
    } while (0)

// Stores a negative status from an expression in the caller's `rc` and jumps to its `done:` label;
// a non-negative result leaves rc as it was.
#define ER_CHECK(expr)               \
    do {                             \
        int er_check_rc_ = (expr);   \
        if (er_check_rc_ < 0) {      \
            rc = er_check_rc_;       \
            goto done;               \
        }                            \
    } while (0)

#endif
