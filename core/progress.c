#include "core/progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void progress_begin(Progress *p, FILE *out, const char *label, const char *unit, int64_t start, int64_t total) {
    p->out = out;
    p->label = label;
    p->unit = unit;
    p->total = total;
    p->start = start;
    p->t_start = p->t_last_print = time_now();
    p->tty = out && isatty(fileno(out));
    p->done = start;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7)
        snprintf(buf, n, "?");
    else if (s < 60)
        snprintf(buf, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

static void print_line(Progress *p, const char *extra, int final) {
    if (!p->out)
        return;
    double now = time_now(), el = now - p->t_start;
    double rate = el > 0 ? (double)(p->done - p->start) / el : 0;
    char eta[32] = "", elapsed[32];
    fmt_duration(elapsed, sizeof elapsed, el);
    if (p->total > 0 && rate > 0 && !final)
        fmt_duration(eta, sizeof eta, (double)(p->total - p->done) / rate);
    if (p->tty) {
        int width = 24, fill = p->total > 0 ? (int)(width * (double)p->done / (double)p->total) : 0;
        char bar[32];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(p->out, "\r\033[K%s [%s] %lld", p->label, bar, (long long)p->done);
    } else {
        fprintf(p->out, "%s: %lld", p->label, (long long)p->done);
    }
    if (p->total > 0)
        fprintf(p->out, "/%lld", (long long)p->total);
    fprintf(p->out, " %s, %.2f %s/s, %s elapsed", p->unit, rate, p->unit, elapsed);
    if (eta[0])
        fprintf(p->out, ", ETA %s", eta);
    if (extra && extra[0])
        fprintf(p->out, ", %s", extra);
    if (!p->tty || final)
        fputc('\n', p->out);
    fflush(p->out);
    p->t_last_print = now;
}

void progress_update(Progress *p, int64_t done, const char *extra) {
    p->done = done;
    double now = time_now();
    double every = p->tty ? 0.1 : 10.0;
    if (now - p->t_last_print >= every || (p->total > 0 && done >= p->total && p->tty))
        print_line(p, extra, 0);
}

void progress_end(Progress *p, const char *extra) { print_line(p, extra, 1); }
