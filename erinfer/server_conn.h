// erinfer serve's connections (erinfer/server_conn.c): a deadline on every request's headers and body,
// and caps on the connections held, overall and per client address, that slow clients cannot fill.
// libmicrohttpd's own connection timeout is an idle timeout, reset by every byte, so a client that
// sends a header line every few seconds (slowloris) keeps its connection, and with one thread per
// connection its thread, for as long as it likes; its per-IP limit counts such a connection like a
// busy one. Here a watchdog shuts down (shutdown(2): the connection's thread then reads the end of
// the stream and closes it) a connection whose request is late, and a connection over a cap evicts
// the oldest one of its address (or, over the overall cap, of any address) that is still waiting
// for its request, so that slow connections cannot lock others out; only connections whose requests
// are all in (being answered) are never evicted. CLI-side code, with erinfer/server.c.
#ifndef ERINFER_SERVER_CONN_H
#define ERINFER_SERVER_CONN_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>

enum {
    SERVE_HEADER_S = 10,          // seconds for a request's headers, from the connection's start or the previous answer
    SERVE_BODY_RATE = 64 << 10,   // a body gets SERVE_HEADER_S more seconds, plus one per this many bytes
};

typedef struct ConnTrack ConnTrack;

// Waits on cond (mu held) until it is signalled or ms milliseconds pass (pthread_cond_timedwait takes an
// absolute CLOCK_REALTIME time).
int cond_wait_ms(pthread_cond_t *cond, pthread_mutex_t *mu, long ms);

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;         // the watchdog's: the guard stops
    ConnTrack *head;             // every open connection
    int cap, per_addr;           // connections held (not being shut down): overall, per client address
    double header_s;             // a request's headers are due this long after the connection waits for it
    int stopping, started;
    pthread_t watchdog;
    long cut, evicted, refused;  // connections shut down: late, evicted by a newer one, over a cap with
                                 // nothing to evict (the newcomer itself)
    long logged;                 // cut + evicted + refused when last logged
    double logged_at;
} ConnGuard;

// Starts the watchdog. cap and per_addr: connections held at once, overall and per address.
int conn_guard_start(ConnGuard *g, int cap, int per_addr, double header_s);
// Stops the watchdog (after the daemon stopped: its connections are closed).
void conn_guard_stop(ConnGuard *g);

// libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the guard): tracks a connection from its
// start (in the daemon's thread, before the connection's thread runs) to its close (before its socket
// is closed, so a shutdown under the guard's lock never reaches a reused descriptor).
void conn_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);

// A request's phases, from the request handler: its headers are in and its body (body_bytes, or the
// body limit when the length is unknown) is due; the whole request is in (no deadline while it is
// answered); the answer is sent and the connection waits for the next request (its headers are due).
void conn_guard_headers_in(ConnGuard *g, struct MHD_Connection *c, uint64_t body_bytes);
void conn_guard_request_in(ConnGuard *g, struct MHD_Connection *c);
void conn_guard_answered(ConnGuard *g, struct MHD_Connection *c);

#endif
