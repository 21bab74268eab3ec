#include "rl/reward_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/json.h"
#include "core/utf8.h"

extern char **environ;

#define START_GRACE_MS 200 // a command that is not found fails within this at start
#define STOP_GRACE_S 1.0   // reward_cmd_free's wait after closing stdin, and again after SIGTERM
#define QUOTE_MAX 80       // bytes of a reply quoted in a message
#define REWARD_MAX_TERMS_TEXT "8"
_Static_assert(REWARD_MAX_TERMS == 8, "REWARD_MAX_TERMS_TEXT spells REWARD_MAX_TERMS");

struct RewardCmd {
    char *prog;
    char label[96];  // `reward program "PROG"`, PROG cut, for messages (the caller's prefix needs room too)
    double timeout_s;
    pid_t pid;       // 0 once reaped
    int status;      // waitpid's status once reaped (-1: reaped by someone else)
    int in_fd;       // our end of PROG's stdin: a socket, so a write after PROG is gone is EPIPE, not SIGPIPE
    int out_fd;      // read end of PROG's stdout
    char *buf;       // bytes read that do not yet end a line: len of cap
    size_t len, cap;
    int broken;      // an earlier error: replies may be out of step
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// A reply for messages: at most QUOTE_MAX bytes, cut at a character boundary, control bytes as '?'.
static void quote_reply(const char *s, size_t n, char *out, size_t cap) {
    size_t k = n > QUOTE_MAX ? QUOTE_MAX : n;
    while (k < n && k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    size_t j = 0;
    for (size_t i = 0; i < k && j + 4 < cap; i++)
        out[j++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (k < n && j + 4 < cap)
        out[j++] = '.', out[j++] = '.', out[j++] = '.';
    out[j] = 0;
}

// Non-blocking reap of PROG, waiting up to wait_s; 1 once reaped.
static int rc_reap(RewardCmd *r, double wait_s) {
    double until = now_s() + wait_s;
    while (r->pid > 0) {
        int st;
        pid_t w = waitpid(r->pid, &st, WNOHANG);
        if (w == r->pid) {
            r->status = st;
            r->pid = 0;
        } else if (w < 0 && errno != EINTR) {
            r->status = -1; // ECHILD: SIGCHLD ignored, the kernel reaped it
            r->pid = 0;
        } else if (now_s() >= until) {
            return 0;
        } else {
            sleep_ms(5);
        }
    }
    return 1;
}

// What became of PROG, for messages: reaps it, waiting up to a second.
static void describe_exit(RewardCmd *r, char *out, size_t cap) {
    if (!rc_reap(r, STOP_GRACE_S))
        snprintf(out, cap, "it is still running");
    else if (r->status == -1)
        snprintf(out, cap, "it exited");
    else if (WIFEXITED(r->status))
        snprintf(out, cap, "it exited with status %d%s", WEXITSTATUS(r->status),
                 WEXITSTATUS(r->status) == 127 ? ": command not found?"
                 : WEXITSTATUS(r->status) == 126 ? ": not executable?" : "");
    else if (WIFSIGNALED(r->status))
        snprintf(out, cap, "it was killed by signal %d (%s)", WTERMSIG(r->status), strsignal(WTERMSIG(r->status)));
    else
        snprintf(out, cap, "it stopped (wait status %d)", r->status);
}

// PROG is gone or stopped talking: what happened (printf-style), and its exit status says why.
__attribute__((format(printf, 2, 3))) static int rc_died(RewardCmd *r, const char *fmt, ...) {
    char what[160], how[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    describe_exit(r, how, sizeof how);
    return er_error(ER_EIO, "%s %s (%s)", r->label, what, how);
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -1 : 0;
}

static int rc_spawn(RewardCmd *r) {
    int rc = ER_OK, sv[2] = {-1, -1}, pp[2] = {-1, -1}, err;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int have_fa = 0, have_at = 0;
    // Close-on-exec everywhere: dup2 onto 0 and 1 clears it for PROG's own ends only, so no other child
    // (another PROG, a shell of the caller) holds these open and hides PROG's EOF.
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 || pipe2(pp, O_CLOEXEC) < 0) {
        rc = er_error(ER_EIO, "%s: cannot make its stdin and stdout: %s", r->label, strerror(errno));
        goto done;
    }
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE); // a caller that ignores SIGPIPE must not pass that on to PROG
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGINT);
    if ((err = posix_spawn_file_actions_init(&fa)) || !(have_fa = 1) ||
        (err = posix_spawn_file_actions_adddup2(&fa, sv[1], 0)) ||
        (err = posix_spawn_file_actions_adddup2(&fa, pp[1], 1)) || (err = posix_spawnattr_init(&at)) ||
        !(have_at = 1) || (err = posix_spawnattr_setpgroup(&at, 0)) ||
        (err = posix_spawnattr_setsigmask(&at, &none)) || (err = posix_spawnattr_setsigdefault(&at, &dfl)) ||
        (err = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                                 POSIX_SPAWN_SETSIGDEF))) {
        rc = er_error(ER_EIO, "%s: cannot set up its start: %s", r->label, strerror(err));
        goto done;
    }
    char *argv[] = {"sh", "-c", r->prog, NULL};
    if ((err = posix_spawn(&r->pid, "/bin/sh", &fa, &at, argv, environ))) {
        r->pid = 0;
        rc = er_error(ER_EIO, "%s: cannot start /bin/sh: %s", r->label, strerror(err));
        goto done;
    }
    r->in_fd = sv[0], r->out_fd = pp[0];
    sv[0] = pp[0] = -1;
    if (set_nonblock(r->in_fd) < 0 || set_nonblock(r->out_fd) < 0)
        rc = er_error(ER_EIO, "%s: cannot make its pipes non-blocking: %s", r->label, strerror(errno));
done:
    if (have_fa)
        posix_spawn_file_actions_destroy(&fa);
    if (have_at)
        posix_spawnattr_destroy(&at);
    for (int i = 0; i < 2; i++) {
        if (sv[i] >= 0)
            close(sv[i]);
        if (pp[i] >= 0)
            close(pp[i]);
    }
    return rc;
}

// Reads what PROG has written so far into r->buf (up to one line's limit): 1 with bytes or nothing yet
// (EAGAIN), 0 at end of file, or a negative status.
static int rc_read(RewardCmd *r) {
    int got = 0;
    for (;;) {
        if (r->len == r->cap) {
            if (r->cap >= REWARD_LINE_MAX + 2)
                return 1; // full: the caller finds no newline in it and says the line is too long
            size_t cap = r->cap ? r->cap * 2 : 65536;
            if (cap > REWARD_LINE_MAX + 2)
                cap = REWARD_LINE_MAX + 2;
            char *p = er_realloc_array(r->buf, cap, 1);
            if (!p)
                return er_error(ER_ENOMEM, "%s: no memory for a reply of %zu bytes", r->label, cap);
            r->buf = p, r->cap = cap;
        }
        ssize_t k = read(r->out_fd, r->buf + r->len, r->cap - r->len);
        if (k > 0) {
            r->len += (size_t)k, got = 1;
            continue;
        }
        if (k == 0)
            return got; // EOF after bytes: the next read sees it again
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 1;
        return er_error(ER_EIO, "%s: cannot read its stdout: %s", r->label, strerror(errno));
    }
}

int reward_cmd_start(const char *prog, double timeout_s, RewardCmd **out) {
    if (!out)
        return er_error(ER_EINVAL, "reward_cmd_start: out is NULL");
    *out = NULL;
    if (!prog || !prog[0])
        return er_error(ER_EINVAL, "reward program: the command is empty");
    size_t pl = strlen(prog);
    if (!(timeout_s > 0) || !isfinite(timeout_s))
        return er_error(ER_EINVAL, "reward program \"%.60s%s\": timeout %g s must be a positive number of seconds",
                        prog, pl > 60 ? "..." : "", timeout_s);
    int rc = ER_OK;
    RewardCmd *r = er_calloc(1, sizeof *r);
    if (!r)
        return ER_ENOMEM;
    r->in_fd = r->out_fd = -1;
    r->timeout_s = timeout_s;
    snprintf(r->label, sizeof r->label, "reward program \"%.60s%s\"", prog, pl > 60 ? "..." : "");
    ER_CHECK((r->prog = er_strdup(prog)) ? ER_OK : ER_ENOMEM);
    ER_CHECK(rc_spawn(r));
    // A command that is not found (or a program that fails at once) is told here rather than at the first
    // score: wait briefly for its stdout to close. Bytes it writes unasked stay for the first score to refuse.
    struct pollfd p = {r->out_fd, POLLIN, 0};
    double until = now_s() + START_GRACE_MS * 1e-3;
    for (double t = now_s(); t < until; t = now_s()) {
        int k = poll(&p, 1, (int)ceil((until - t) * 1e3));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        int got = rc_read(r);
        ER_CHECK(got);
        if (got == 0) {
            rc = rc_died(r, "exited at start");
            goto done;
        }
        if (r->len == r->cap)
            break;
    }
    *out = r;
    r = NULL;
done:
    reward_cmd_free(r);
    return rc;
}

// One query as one line of JSON (newline included), NUL-free, in *line (free with cJSON_free).
// Completions cut inside a UTF-8 character (a budget reached mid-token) would make the line invalid
// JSON text for PROG's parser, so ill-formed bytes are sent as U+FFFD, as Python's errors="replace" does.
static char *lossy_utf8(const char *s) {
    size_t n = strlen(s);
    if (utf8_invalid_at(s, n) == n)
        return NULL; // valid: use s itself
    size_t cap;
    if (er_mul_size(n, 3, &cap) < 0 || er_add_size(cap, 1, &cap) < 0)
        return NULL;
    char *o = er_alloc(cap);
    if (!o)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        int w = utf8_next((const unsigned char *)s + i, n - i);
        if (w > 0) {
            memcpy(o + j, s + i, (size_t)w);
            i += (size_t)w, j += (size_t)w;
        } else {
            memcpy(o + j, "\xEF\xBF\xBD", 3);
            i += (size_t)-w, j += 3;
        }
    }
    o[j] = 0;
    return o;
}

static int add_text(cJSON *o, const char *key, const char *s) {
    if (!s)
        return cJSON_AddNullToObject(o, key) ? 0 : -1;
    char *fixed = lossy_utf8(s);
    int ok = cJSON_AddStringToObject(o, key, fixed ? fixed : s) != NULL;
    er_free(fixed);
    return ok ? 0 : -1;
}

static int encode_query(const RewardCmd *r, const RewardQuery *q, char **line, size_t *n) {
    cJSON *o = cJSON_CreateObject();
    char *s = NULL;
    if (o && !add_text(o, "prompt", q->prompt) && !add_text(o, "completion", q->completion) &&
        !add_text(o, "answer", q->answer) && cJSON_AddNumberToObject(o, "budget", q->budget) &&
        cJSON_AddNumberToObject(o, "length", q->length))
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s)
        return er_error(ER_ENOMEM, "%s: no memory to write a query", r->label);
    *n = strlen(s);
    s[(*n)++] = '\n'; // cJSON escapes every newline inside, so this one ends the line
    *line = s;
    return ER_OK;
}

static int bad_reply(const RewardCmd *r, int i, const char *s, size_t n, const char *why) {
    char q[QUOTE_MAX * 2];
    quote_reply(s, n, q, sizeof q);
    return er_error(ER_EFORMAT, "%s: reply %d %s: \"%s\"", r->label, i + 1, why, q);
}

// One reply line (s, n bytes, NUL at s[n]; the newline gone) into t.
static int parse_reply(const RewardCmd *r, int i, char *s, size_t n, RewardTerms *t) {
    if (n > 0 && s[n - 1] == '\r')
        s[--n] = 0;
    if (utf8_invalid_at(s, n) != n)
        return bad_reply(r, i, s, n, "is not UTF-8");
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    int rc = ER_OK;
    memset(t, 0, sizeof *t);
    if (!j || json_trailing_at(s, n, end) >= 0) {
        char *e;
        double v = strtod(s, &e);
        int whole = e != s && json_trailing_at(s, n, e) < 0;
        rc = bad_reply(r, i, s, n, whole && !isfinite(v) ? "is not a finite number"
                                   : "is not a number or a JSON object of numbers");
    } else if (cJSON_IsNumber(j)) {
        if (!isfinite(j->valuedouble))
            rc = bad_reply(r, i, s, n, "is not a finite number");
        t->n = 1;
        strcpy(t->name[0], "cmd");
        t->value[0] = j->valuedouble;
    } else if (!cJSON_IsObject(j) || !j->child) {
        rc = bad_reply(r, i, s, n, "is not a number or a JSON object of numbers");
    } else {
        for (const cJSON *c = j->child; c && rc == ER_OK; c = c->next) {
            size_t kl = strlen(c->string);
            if (t->n == REWARD_MAX_TERMS)
                rc = bad_reply(r, i, s, n, "has more than " REWARD_MAX_TERMS_TEXT " terms");
            else if (kl == 0 || kl >= sizeof t->name[0])
                rc = bad_reply(r, i, s, n, "names a term with an empty name or one longer than 31 bytes");
            else if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble))
                rc = bad_reply(r, i, s, n, "has a term that is not a finite number");
            for (int k = 0; k < t->n && rc == ER_OK; k++)
                if (!strcmp(t->name[k], c->string))
                    rc = bad_reply(r, i, s, n, "names a term twice");
            if (rc == ER_OK) {
                memcpy(t->name[t->n], c->string, kl + 1);
                t->value[t->n++] = c->valuedouble;
            }
        }
    }
    cJSON_Delete(j);
    return rc;
}

// One score_many call: queries are written one line at a time while replies are read.
typedef struct {
    const RewardQuery *q;
    RewardTerms *out;
    int n;
    int wi, ri;               // queries fully written, replies read
    char *line;               // query wi's line being written (cJSON's allocation)
    size_t line_n, line_off;
    double *sent_at;          // (n) when query i was fully written
    double last_reply, last_write;
} Batch;

// Writes as much of the query lines as PROG's stdin takes now.
static int rc_write(RewardCmd *r, Batch *b) {
    for (;;) {
        if (b->line_off == b->line_n) {
            if (b->line) {
                b->sent_at[b->wi++] = now_s();
                cJSON_free(b->line);
                b->line = NULL;
            }
            if (b->wi == b->n)
                return ER_OK;
            ER_TRY(encode_query(r, &b->q[b->wi], &b->line, &b->line_n));
            b->line_off = 0;
        }
        ssize_t k = send(r->in_fd, b->line + b->line_off, b->line_n - b->line_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            b->line_off += (size_t)k;
            b->last_write = now_s();
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return ER_OK;
        } else if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            return rc_died(r, "stopped reading its stdin at query %d of %d", b->wi + 1, b->n);
        } else {
            return er_error(ER_EIO, "%s: cannot write to its stdin: %s", r->label, strerror(errno));
        }
    }
}

// Reads PROG's stdout and parses every complete line into the next reply.
static int rc_collect(RewardCmd *r, Batch *b) {
    int got = rc_read(r);
    ER_TRY(got);
    size_t start = 0;
    char *nl;
    while (b->ri < b->n && (nl = memchr(r->buf + start, '\n', r->len - start))) {
        size_t ln = (size_t)(nl - (r->buf + start));
        if (ln > REWARD_LINE_MAX)
            return bad_reply(r, b->ri, r->buf + start, ln, "is longer than 1 MiB");
        *nl = 0;
        ER_TRY(parse_reply(r, b->ri, r->buf + start, ln, &b->out[b->ri]));
        b->ri++;
        b->last_reply = now_s();
        start += ln + 1;
    }
    memmove(r->buf, r->buf + start, r->len - start);
    r->len -= start;
    if (r->len > REWARD_LINE_MAX)
        return bad_reply(r, b->ri, r->buf, r->len, "is longer than 1 MiB");
    if (got == 0 && b->ri < b->n)
        return rc_died(r, "closed its stdout after %d of %d replies", b->ri, b->n);
    return ER_OK;
}

// One wait for PROG: until its stdin takes more, its stdout has more, or the reply now due is late.
static int rc_step(RewardCmd *r, Batch *b) {
    double t = now_s(), deadline;
    int waiting_reply = b->wi > b->ri; // query ri is all in PROG's stdin: its reply is due
    if (waiting_reply)
        deadline = fmax(b->sent_at[b->ri], b->last_reply) + r->timeout_s;
    else
        deadline = fmax(b->last_write, b->last_reply) + r->timeout_s;
    if (t >= deadline && waiting_reply)
        return er_error(ER_EIO, "%s: no reply to query %d of %d within %g s (does it flush its stdout after "
                        "each line?)", r->label, b->ri + 1, b->n, r->timeout_s);
    if (t >= deadline)
        return er_error(ER_EIO, "%s: did not read query %d of %d from its stdin within %g s", r->label, b->wi + 1,
                        b->n, r->timeout_s);
    struct pollfd p[2] = {{r->out_fd, POLLIN, 0}, {r->in_fd, POLLOUT, 0}};
    int np = b->wi < b->n ? 2 : 1;
    double ms = ceil((deadline - t) * 1e3);
    int k = poll(p, (nfds_t)np, ms > 1e9 ? 1000000000 : (int)ms);
    if (k < 0 && errno != EINTR)
        return er_error(ER_EIO, "%s: poll failed: %s", r->label, strerror(errno));
    if (k <= 0)
        return ER_OK;
    if (np == 2 && p[1].revents)
        ER_TRY(rc_write(r, b));
    if (p[0].revents)
        ER_TRY(rc_collect(r, b));
    return ER_OK;
}

// Before a call: PROG has written nothing unasked and is still there.
static int rc_check_idle(RewardCmd *r) {
    struct pollfd p = {r->out_fd, POLLIN, 0};
    if (r->len == 0 && poll(&p, 1, 0) <= 0)
        return ER_OK;
    int got = rc_read(r);
    ER_TRY(got);
    if (r->len > 0) {
        char q[QUOTE_MAX * 2], *nl = memchr(r->buf, '\n', r->len);
        quote_reply(r->buf, nl ? (size_t)(nl - r->buf) : r->len, q, sizeof q);
        return er_error(ER_EFORMAT, "%s: wrote a line it was not asked for (more replies than queries?): \"%s\"",
                        r->label, q);
    }
    if (got == 0)
        return rc_died(r, "closed its stdout");
    return ER_OK;
}

int reward_cmd_score_many(RewardCmd *r, const RewardQuery *q, int n, RewardTerms *out) {
    if (!r || (n > 0 && (!q || !out)) || n < 0)
        return er_error(ER_EINVAL, "reward_cmd_score_many: NULL argument or negative count");
    if (r->broken)
        return er_error(ER_EINVAL, "%s: not usable after an earlier error", r->label);
    if (n == 0)
        return ER_OK;
    int rc = ER_OK;
    Batch b = {.q = q, .out = out, .n = n};
    ER_CHECK((b.sent_at = er_calloc((size_t)n, sizeof *b.sent_at)) ? ER_OK : ER_ENOMEM);
    ER_CHECK(rc_check_idle(r));
    b.last_reply = b.last_write = now_s();
    ER_CHECK(rc_write(r, &b));
    while (b.ri < n)
        ER_CHECK(rc_step(r, &b));
    if (r->len > 0) // a line past the last reply: PROG answers some query twice
        ER_CHECK(rc_check_idle(r));
done:
    if (rc < 0)
        r->broken = 1;
    cJSON_free(b.line);
    er_free(b.sent_at);
    return rc;
}

int reward_cmd_score(RewardCmd *r, const RewardQuery *q, RewardTerms *out) {
    return reward_cmd_score_many(r, q, 1, out);
}

void reward_cmd_free(RewardCmd *r) {
    if (!r)
        return;
    // EOF on its stdin asks PROG to finish; closing its stdout too means a last write cannot block it.
    if (r->in_fd >= 0)
        close(r->in_fd);
    if (r->out_fd >= 0)
        close(r->out_fd);
    if (r->pid > 0 && !rc_reap(r, STOP_GRACE_S)) {
        kill(-r->pid, SIGTERM); // its process group: sh -c may have forked PROG rather than exec'd it
        if (!rc_reap(r, STOP_GRACE_S)) {
            kill(-r->pid, SIGKILL);
            while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR) {
            }
        }
    }
    er_free(r->buf);
    er_free(r->prog);
    er_free(r);
}
