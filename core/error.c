#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_msg[1024];
static _Thread_local int last_status;

// Messages are formatted into a local buffer first: the arguments may point into last_msg itself
// (er_error(rc, "%s: %s", ctx, er_last_error()) reads the message it replaces).
int er_error(int status, const char *fmt, ...) {
    char buf[sizeof last_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(last_msg, buf, sizeof buf);
    last_status = status;
    return status;
}

int er_error_prefix(int status, const char *fmt, ...) {
    char ctx[512], buf[sizeof last_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    const char *old = last_msg[0] ? last_msg : er_status_name(status);
    snprintf(buf, sizeof buf, "%.511s: %.*s", ctx, (int)(sizeof buf - 514), old);
    memcpy(last_msg, buf, sizeof buf);
    last_status = status;
    return status;
}

const char *er_last_error(void) { return last_msg[0] ? last_msg : "no error"; }
int er_last_status(void) { return last_status; }
void er_clear_error(void) { last_msg[0] = 0; last_status = ER_OK; }

const char *er_status_name(int status) {
    switch (status) {
#define ER_STATUS_CASE_(name, value, text) case name: return text;
    ER_STATUS_LIST(ER_STATUS_CASE_)
#undef ER_STATUS_CASE_
    default: return "unknown status";
    }
}
