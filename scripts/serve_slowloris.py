#!/usr/bin/env python3
"""A bounded slowloris against erinfer serve on 127.0.0.1 (never another host), checking that it goes on serving.

  scripts/serve_slowloris.py PORT [--conns 300] [--per-address 69] [--header-s 10] [--grace 10]

1. Opens --conns connections that send a request line and one header, and 20 that send whole headers
   announcing a 100000-byte body and then a few bytes of it. Over the server's per-address cap the oldest
   waiting connections are evicted: at most --per-address stay open.
2. Every second each open connection sends one more header line (or 16 body bytes): an idle timeout never
   fires on them. Meanwhile GET /health, a chat request and a well-behaved slow client (its headers over 3 s)
   must each be answered 200 (each with a 30 s client timeout).
3. Every attacking connection must be closed by the server by its deadline plus --grace seconds (headers
   --header-s after the connection, a body --header-s plus 1 s per 64 KiB after its headers), and none
   before its deadline (less 0.5 s) but the three that the clients' connections evict: the deadline is on
   the request, not on idle time.
The run ends when every attacking connection is closed or the last deadline plus --grace has passed (about
15 s against a working server, 25 s at most). Prints what it measured; exits 1 on any failed check.
"""
import argparse
import http.client
import json
import select
import socket
import sys
import threading
import time

HOST = "127.0.0.1"


class Attacker:
    def __init__(self, port, body):
        self.body = body
        self.sock = socket.create_connection((HOST, port), timeout=5)
        self.opened = time.monotonic()
        self.closed_at = None
        self.lines = 0
        if body:
            self.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000\r\n\r\n{\"messages\": " % (HOST.encode(), port))
        else:
            self.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n" % (HOST.encode(), port))
        self.sock.setblocking(False)

    def send(self, data):
        try:
            self.sock.sendall(data)
        except OSError:
            self.mark_closed()

    def mark_closed(self):
        if self.closed_at is None:
            self.closed_at = time.monotonic()
            self.sock.close()

    def poll_closed(self):
        """Whether the server closed it: a read gives end of stream or an error (it sends nothing otherwise)."""
        if self.closed_at is not None:
            return True
        r, _, _ = select.select([self.sock], [], [], 0)
        if r:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return False
            except OSError:
                data = b""
            if not data:
                self.mark_closed()
            # An answer (a 413, say) would be data: not expected before the body; keep reading.
        return self.closed_at is not None

    def dribble(self):
        self.lines += 1
        self.send(b"{\"role\": " * 2 if self.body else b"X-Slow-%d: 1\r\n" % self.lines)


def request(port, method, path, body, results, name):
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection(HOST, port, timeout=30)
        headers = {"Content-Type": "application/json"} if body else {}
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        payload = r.read()
        results[name] = (r.status, time.monotonic() - t0, payload[:200])
        c.close()
    except OSError as e:
        results[name] = (None, time.monotonic() - t0, repr(e))


def slow_client(port, results):
    """A client whose headers take 3 s, well inside the deadline: it is served."""
    t0 = time.monotonic()
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()
    try:
        s = socket.create_connection((HOST, port), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n" % (HOST.encode(), port))
        for line in (b"Content-Type: application/json\r\n", b"Content-Length: %d\r\n" % len(body), b"X-A: 1\r\n"):
            time.sleep(1)
            s.sendall(line)
        s.sendall(b"Connection: close\r\n\r\n" + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
        s.close()
        results["slow client"] = (int(raw.split()[1]), time.monotonic() - t0, raw[-120:])
    except (OSError, IndexError, ValueError) as e:
        results["slow client"] = (None, time.monotonic() - t0, repr(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--conns", type=int, default=300)
    ap.add_argument("--body-conns", type=int, default=20)
    ap.add_argument("--per-address", type=int, default=69)
    ap.add_argument("--header-s", type=float, default=10)
    ap.add_argument("--grace", type=float, default=10)
    a = ap.parse_args()
    failures = []
    attackers = []
    for i in range(a.conns + a.body_conns):
        try:
            attackers.append(Attacker(a.port, i >= a.conns))
        except OSError as e:
            failures.append(f"connection {i} could not be opened: {e!r}")
            break
    time.sleep(1.0)
    survivors = [x for x in attackers if not x.poll_closed()]
    held = len(survivors)
    print(f"slowloris: {len(attackers)} connections opened, {held} held by the server after 1 s "
          f"(per-address cap {a.per_address})")
    if held > a.per_address:
        failures.append(f"{held} attacking connections held, more than the per-address cap of {a.per_address}")
    results = {}
    clients = [threading.Thread(target=request, args=(a.port, "GET", "/health", None, results, "/health")),
               threading.Thread(target=request, args=(a.port, "POST", "/v1/chat/completions",
                                                     json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                                                 "max_tokens": 4}), results, "chat")),
               threading.Thread(target=slow_client, args=(a.port, results))]
    for t in clients:
        t.start()
    body_due = a.header_s + 100000 / 65536
    end = max(x.opened for x in attackers) + body_due + 1 + a.grace
    while time.monotonic() < end and not all(x.poll_closed() for x in attackers):
        for x in attackers:
            if not x.poll_closed():
                x.dribble()
        time.sleep(1.0)
    for t in clients:
        t.join(timeout=30)
    for name in ("/health", "chat", "slow client"):
        status, took, detail = results.get(name, (None, 0, "no answer"))
        print(f"slowloris: {name} under attack: status {status} in {took:.2f} s")
        if status != 200:
            failures.append(f"{name} got {status}: {detail}")
    open_left = [x for x in attackers if not x.poll_closed()]
    # The ones that outlived the eviction: closed by the deadline, not before it.
    lives = sorted(x.closed_at - x.opened for x in survivors if x.closed_at is not None)
    if lives:
        print(f"slowloris: {len(survivors)} connections outlived the eviction; closed after {lives[0]:.1f} to "
              f"{lives[-1]:.1f} s while sending a line a second")
    if open_left:
        failures.append(f"{len(open_left)} attacking connections still open after their deadline + {a.grace} s")
    # Each of the three clients' connections evicts one waiting attacker; the rest go at their deadline.
    early = [x for x in survivors if x.closed_at is not None and
             x.closed_at - x.opened < (body_due if x.body else a.header_s) - 0.5]
    print(f"slowloris: {len(early)} of them evicted to make room for the three clients")
    if len(early) > len(clients):
        x = early[-1]
        failures.append(f"{len(early)} connections closed before their deadline (one after "
                        f"{x.closed_at - x.opened:.1f} s), more than the {len(clients)} evicted by the clients")
    for x in open_left:
        x.sock.close()
    for f in failures:
        print(f"slowloris: FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
