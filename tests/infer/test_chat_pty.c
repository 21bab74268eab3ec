// erinfer chat on a terminal, as a user drives it: the program runs on a pseudo-terminal (the committed
// tiny base, models/tiny-base) and the test types into it. Ctrl-C during a reply stops the reply and the
// chat goes on with the conversation kept; Ctrl-C at the prompt says how to leave, and a second one leaves
// with status 0.
//
// No timing decides anything: the test stops the terminal's output (^S, as a user's XOFF) before sending
// the line, waits until the program has read it (its read count in /proc/PID/io), and only then types ^C.
// The program's first token is then stuck in its write to the stopped terminal, so the ^C (which restarts
// the output) always lands during the reply.
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/helpers.h"

// A program on the master side of a pseudo-terminal and everything it wrote so far.
typedef struct {
    int fd;
    pid_t pid;
    char out[1 << 16];
    size_t n, seen; // bytes in out; where the last expect matched (the next one searches past it)
} Pty;

static void pty_spawn(Pty *p, char *const argv[]) {
    memset(p, 0, sizeof *p);
    p->fd = posix_openpt(O_RDWR | O_NOCTTY);
    cr_assert_geq(p->fd, 0, "posix_openpt: %s", strerror(errno));
    cr_assert_eq(grantpt(p->fd), 0);
    cr_assert_eq(unlockpt(p->fd), 0);
    const char *name = ptsname(p->fd);
    cr_assert(name);
    p->pid = fork();
    cr_assert_geq(p->pid, 0);
    if (p->pid == 0) {
        // A session of its own with the terminal as its controlling one: ^C reaches it as SIGINT.
        setsid();
        int s = open(name, O_RDWR);
        if (s < 0 || ioctl(s, TIOCSCTTY, 0) < 0)
            _exit(126);
        dup2(s, 0);
        dup2(s, 1);
        dup2(s, 2);
        if (s > 2)
            close(s);
        close(p->fd);
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv(argv[0], argv);
        _exit(127);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A guard against a hang, not a measurement: far beyond what any step takes.
#define PTY_GUARD_S 45.0

// Reads until `needle` appears past the last match; fails (with the transcript) if the program ends first.
static void pty_expect(Pty *p, const char *needle) {
    double t0 = now_s();
    for (;;) {
        p->out[p->n] = 0;
        char *hit = strstr(p->out + p->seen, needle);
        if (hit) {
            p->seen = (size_t)(hit - p->out) + strlen(needle);
            return;
        }
        cr_assert_lt(now_s() - t0, PTY_GUARD_S, "no \"%s\" from erinfer chat; it wrote:\n%s", needle, p->out);
        struct pollfd pf = {p->fd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t k = read(p->fd, p->out + p->n, sizeof p->out - 1 - p->n);
        cr_assert_gt(k, 0, "erinfer chat ended before \"%s\"; it wrote:\n%s", needle, p->out);
        p->n += (size_t)k;
    }
}

static void pty_send(Pty *p, const char *s) {
    size_t n = strlen(s);
    cr_assert_eq(write(p->fd, s, n), (ssize_t)n);
}

// The bytes the program has read so far (the kernel's count, whatever it read them from).
static long read_count(pid_t pid) {
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/%d/io", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s: %s", path, strerror(errno));
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %ld", &v) == 1)
            break;
    fclose(f);
    cr_assert_geq(v, 0, "%s has no rchar line", path);
    return v;
}

// Waits until the program has read `n` more bytes than `base`.
static void wait_read(Pty *p, long base, long n) {
    double t0 = now_s();
    while (read_count(p->pid) < base + n) {
        cr_assert_lt(now_s() - t0, PTY_GUARD_S, "erinfer chat never read the line; it wrote:\n%s", p->out);
        usleep(2000);
    }
}

// Drains the output and waits for the program's end; returns its exit status (128 + signal if killed).
static int pty_wait(Pty *p) {
    double t0 = now_s();
    for (;;) {
        int st;
        pid_t w = waitpid(p->pid, &st, WNOHANG);
        if (w == p->pid) {
            close(p->fd);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        }
        if (now_s() - t0 > PTY_GUARD_S) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            cr_assert_fail("erinfer chat did not leave; it wrote:\n%s", p->out);
        }
        struct pollfd pf = {p->fd, POLLIN, 0};
        if (poll(&pf, 1, 50) > 0) {
            ssize_t k = read(p->fd, p->out + p->n, sizeof p->out - 1 - p->n);
            if (k > 0)
                p->n += (size_t)k;
        }
        p->out[p->n] = 0;
    }
}

Test(chat_pty, ctrl_c_stops_the_reply_then_leaves) {
    char *prog = helper_program("erinfer");
    helper_need_program(prog, "erinfer", "erinfer chat terminal test");
    char *argv[] = {prog, "chat", "--model", "models/tiny-base", "--max-new", "300", "--threads", "1", NULL};
    Pty p;
    pty_spawn(&p, argv);
    pty_expect(&p, "/help for commands");
    pty_expect(&p, "> ");
    // Output stopped, then the question; once it is read the reply's first write waits on the terminal.
    long base = read_count(p.pid);
    pty_send(&p, "\x13");
    const char *q = "Start with 7. Add 5. Multiply by 3. What is the result?\n";
    pty_send(&p, q);
    wait_read(&p, base, (long)strlen(q));
    pty_send(&p, "\x03");
    pty_expect(&p, "[stopped");
    pty_expect(&p, "> ");
    // The chat goes on in the same session: the next turn is answered and reuses the cached conversation.
    pty_send(&p, "What is 2 + 3?\n");
    pty_expect(&p, "prompt tokens (");
    size_t stats = p.seen;
    pty_expect(&p, "> ");
    int reused = -1;
    cr_assert_eq(sscanf(p.out + stats, "%d reused)", &reused), 1, "no reuse count:\n%s", p.out);
    cr_assert_gt(reused, 0, "the second turn recomputed the whole conversation:\n%s", p.out);
    // Ctrl-C at the prompt says how to leave; a second one leaves, cleanly.
    pty_send(&p, "\x03");
    pty_expect(&p, "Ctrl-C again");
    pty_expect(&p, "> ");
    pty_send(&p, "\x03");
    int status = pty_wait(&p);
    cr_assert_eq(status, 0, "erinfer chat exited %d after two Ctrl-C; it wrote:\n%s", status, p.out);
    er_free(prog);
}
