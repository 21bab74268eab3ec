// erinfer serve's connection guard (erinfer/server_conn.h): deadlines on requests, caps on connections.
#include "erinfer/server_conn.h"

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"

typedef enum { CONN_WAIT, CONN_BODY, CONN_BUSY } ConnPhase; // waiting for headers, for the body; answering

struct ConnTrack {
    int fd;
    int family;
    unsigned char addr[16];  // the client's IPv4 or IPv6 address
    ConnPhase phase;
    double since, due;       // the phase's start and (WAIT, BODY) its deadline, monotonic seconds
    int cut;                 // shut down: closing, no longer counted
    ConnTrack *prev, *next;
};

static double mono_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void track_addr(ConnTrack *t, const struct sockaddr *sa) {
    t->family = sa ? sa->sa_family : AF_UNSPEC;
    if (t->family == AF_INET)
        memcpy(t->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    else if (t->family == AF_INET6)
        memcpy(t->addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
}

static int same_addr(const ConnTrack *a, const ConnTrack *b) {
    return a->family == b->family && memcmp(a->addr, b->addr, sizeof a->addr) == 0;
}

// Lock held. The connection's thread reads the end of its stream and closes it; the descriptor stays
// open until the close notification, which takes the lock.
static void track_shut(ConnTrack *t) {
    shutdown(t->fd, SHUT_RDWR);
    t->cut = 1;
}

// Lock held: the connection to evict for newcomer t, of t's address when `own` (else of any): the
// oldest still waiting for its headers, else the oldest still sending its body; t itself when none
// (nothing else may go: t is refused).
static ConnTrack *guard_victim(ConnGuard *g, ConnTrack *t, int own) {
    ConnTrack *best = NULL;
    for (ConnTrack *o = g->head; o; o = o->next) {
        if (o == t || o->cut || o->phase == CONN_BUSY || (own && !same_addr(o, t)))
            continue;
        if (!best || o->phase < best->phase || (o->phase == best->phase && o->since < best->since))
            best = o;
    }
    return best ? best : t;
}

// Lock held: newcomer t (in the list) over a cap makes room.
static void guard_make_room(ConnGuard *g, ConnTrack *t) {
    int all = 0, same = 0;
    for (ConnTrack *o = g->head; o; o = o->next)
        if (!o->cut) {
            all++;
            same += same_addr(o, t);
        }
    if (same <= g->per_addr && all <= g->cap)
        return;
    ConnTrack *v = guard_victim(g, t, same > g->per_addr);
    track_shut(v);
    if (v == t)
        g->refused++;
    else
        g->evicted++;
}

// Lock held: one line at most every 5 s while connections are being closed, with the totals.
static void guard_log(ConnGuard *g, double now, int force) {
    long total = g->cut + g->evicted + g->refused;
    if (total == g->logged || (!force && now - g->logged_at < 5.0))
        return;
    fprintf(stderr, "erinfer serve: connections closed so far: %ld late (a request's headers are due %g s after "
            "it may start), %ld evicted by newer ones, %ld refused (at most %d connections, %d per address)\n",
            g->cut, g->header_s, g->evicted, g->refused, g->cap, g->per_addr);
    g->logged = total;
    g->logged_at = now;
}

// The watchdog: four times a second, every connection whose headers or body are late is shut down.
int cond_wait_ms(pthread_cond_t *cond, pthread_mutex_t *mu, long ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(cond, mu, &t);
}

static void *guard_main(void *arg) {
    ConnGuard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stopping) {
        cond_wait_ms(&g->wake, &g->mu, 250);
        double now = mono_now();
        for (ConnTrack *c = g->head; c; c = c->next)
            if (!c->cut && c->phase != CONN_BUSY && now > c->due) {
                track_shut(c);
                g->cut++;
            }
        guard_log(g, now, 0);
    }
    guard_log(g, mono_now(), 1);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int conn_guard_start(ConnGuard *g, int cap, int per_addr, double header_s) {
    memset(g, 0, sizeof *g);
    g->cap = cap;
    g->per_addr = per_addr;
    g->header_s = header_s;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->watchdog, NULL, guard_main, g) != 0)
        return er_error(ER_ENOMEM, "cannot start the connection watchdog thread");
    g->started = 1;
    return ER_OK;
}

void conn_guard_stop(ConnGuard *g) {
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->mu);
    if (g->started)
        pthread_join(g->watchdog, NULL);
    g->started = 0;
    while (g->head) { // none once the daemon stopped; freed all the same
        ConnTrack *t = g->head;
        g->head = t->next;
        er_free(t);
    }
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->mu);
}

void conn_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code) {
    ConnGuard *g = cls;
    ConnTrack *t = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (!t)
            return;
        pthread_mutex_lock(&g->mu);
        if (t->prev)
            t->prev->next = t->next;
        else
            g->head = t->next;
        if (t->next)
            t->next->prev = t->prev;
        pthread_mutex_unlock(&g->mu);
        er_free(t);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!fd)
        return;
    if (!(t = er_calloc(1, sizeof *t))) { // untracked, it would escape the deadlines: refused
        shutdown(fd->connect_fd, SHUT_RDWR);
        return;
    }
    t->fd = fd->connect_fd;
    track_addr(t, ad ? ad->client_addr : NULL);
    pthread_mutex_lock(&g->mu);
    t->phase = CONN_WAIT;
    t->since = mono_now();
    t->due = t->since + g->header_s;
    t->next = g->head;
    if (g->head)
        g->head->prev = t;
    g->head = t;
    *socket_context = t;
    guard_make_room(g, t);
    pthread_mutex_unlock(&g->mu);
}

static void guard_phase(ConnGuard *g, struct MHD_Connection *c, ConnPhase phase, double extra_s) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    ConnTrack *t = ci ? ci->socket_context : NULL;
    if (!t)
        return;
    pthread_mutex_lock(&g->mu);
    t->phase = phase;
    t->since = mono_now();
    t->due = t->since + g->header_s + extra_s;
    pthread_mutex_unlock(&g->mu);
}

void conn_guard_headers_in(ConnGuard *g, struct MHD_Connection *c, uint64_t body_bytes) {
    guard_phase(g, c, CONN_BODY, (double)body_bytes / SERVE_BODY_RATE);
}

void conn_guard_request_in(ConnGuard *g, struct MHD_Connection *c) { guard_phase(g, c, CONN_BUSY, 0); }

void conn_guard_answered(ConnGuard *g, struct MHD_Connection *c) { guard_phase(g, c, CONN_WAIT, 0); }
