#!/usr/bin/env python3
"""sluice's fault-injecting HTTP server, for tests and benchmarks (loopback only).

Serves the files under ROOT (GET and HEAD, Range, ETag, If-Match) and misbehaves on
purpose, each fault drawn per request from a seeded generator:
  --p503 F       answer 503 with S3's SlowDown XML body
  --preset F     send headers and part of the body, then reset the connection
  --ptrunc F     send fewer bytes than Content-Length, then close
  --pstall F     send part of the body, then stall for --stall-s seconds
  --ttfb-ms MS   wait this long before every answer's first byte (object-store latency)
  --no-ranges    ignore Range headers (answer 200 with the whole object)
  --chunked      send bodies with Transfer-Encoding: chunked (no Content-Length)
  --http10       answer as HTTP/1.0 (the connection closes after each answer)
  --max-concurrent N  answer at most N requests at once (others wait their turn, as
                 behind a server with N workers): the rate tops out at N / latency
  --busy-503 N   answer 503 (SlowDown, at once) to a request that arrives while N are
                 being answered: with --ttfb-ms, a request rate above N / latency is
                 throttled, as an object store throttles a prefix
  --stall-first N  the first N answers with a body send half of it, then stall for
                 --stall-s seconds (a download to interrupt at a known point)
  --flip NAME    the object NAME gets a new version (content and ETag) after its first
                 request has sent half of it
Names starting with "forbidden" answer 403 (AccessDenied XML). GET /__stats answers
"requests N concurrent_max M throttled T sent B": requests so far, the most answered at once
since the last GET /__stats?reset, the 503s sent, and the bytes of bodies sent (tests check that a client's requests in flight shrink). It listens on 127.0.0.1 on
a free port and prints "port N" on stdout once it accepts connections. Stop it by pid.
"""
import argparse
import os
import random
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = None
lock = threading.Lock()
rng = None
flipped = set()
stats = {"requests": 0, "concurrent": 0, "concurrent_max": 0, "throttled": 0, "sent": 0, "bodies": 0}
workers = None  # --max-concurrent: a semaphore


def draw():
    with lock:
        stats["requests"] += 1
        return rng.random()


def xml_error(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>'
            % (code, message)).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm
    # and the client's delayed ACK hold each short reply back about 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, *a):  # quiet
        pass

    def send_xml(self, status, code, message):
        body = xml_error(code, message)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def content(self, name):
        path = os.path.join(args.root, name)
        with open(path, "rb") as f:
            data = f.read()
        version = 1
        if name in flipped:
            data = bytes(reversed(data))
            version = 2
        return data, '"v%d-%d"' % (version, len(data))

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head=False):
        if self.path.startswith("/__stats"):
            with lock:
                body = ("requests %d concurrent_max %d throttled %d sent %d\n"
                        % (stats["requests"], stats["concurrent_max"], stats["throttled"], stats["sent"])).encode()
                if "reset" in self.path:
                    stats["concurrent_max"] = stats["concurrent"]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if args.busy_503:
            with lock:
                busy = stats["concurrent"] >= args.busy_503
                if busy:
                    stats["requests"] += 1
                    stats["throttled"] += 1
            if busy:
                return self.send_xml(503, "SlowDown", "Please reduce your request rate.")
        if workers:
            workers.acquire()
        with lock:
            stats["concurrent"] += 1
            stats["concurrent_max"] = max(stats["concurrent_max"], stats["concurrent"])
        try:
            self.answer(head)
        finally:
            with lock:
                stats["concurrent"] -= 1
            if workers:
                workers.release()

    def answer(self, head):
        if args.ttfb_ms:
            time.sleep(args.ttfb_ms / 1000.0)
        name = self.path.split("?")[0].lstrip("/")
        if os.path.basename(name).startswith("forbidden"):
            return self.send_xml(403, "AccessDenied", "Access Denied")
        path = os.path.join(args.root, name)
        if ".." in name.split("/") or not os.path.isfile(path):
            return self.send_xml(404, "NoSuchKey", "The specified key does not exist.")
        r = draw()
        if r < args.p503:
            with lock:
                stats["throttled"] += 1
            return self.send_xml(503, "SlowDown", "Please reduce your request rate.")
        r -= args.p503
        data, etag = self.content(name)
        if_match = self.headers.get("If-Match")
        if if_match and if_match != etag:
            return self.send_xml(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
        start, end, status = 0, len(data), 200
        rng_header = self.headers.get("Range")
        if rng_header and rng_header.startswith("bytes=") and "," not in rng_header and not args.no_ranges:
            a, _, b = rng_header[6:].partition("-")
            start = int(a)
            if b:
                end = min(len(data), int(b) + 1)
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % len(data))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start:end]
        self.send_response(status)
        if args.chunked and not head:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, len(data)))
        self.end_headers()
        if head:
            return
        half = len(body) // 2
        self.whole = body
        with lock:
            stats["bodies"] += 1
            stall_first = stats["bodies"] <= args.stall_first
        if stall_first:
            self.send_counted(body[:half])
            time.sleep(args.stall_s)
            self.close_connection = True
            return
        if args.flip and name == args.flip and name not in flipped:
            self.send_counted(body[:half])
            with lock:
                flipped.add(name)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if r < args.preset:
            self.send_counted(body[:half])
            # RST instead of FIN: linger 0, then close.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            self.connection.close()
            return
        r -= args.preset
        if r < args.ptrunc:
            self.send_counted(body[:half])
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        r -= args.ptrunc
        if r < args.pstall:
            self.send_counted(body[:half])
            time.sleep(args.stall_s)
            self.close_connection = True
            return
        self.send_counted(body)

    def send_counted(self, data):
        if args.chunked:  # (a cut or stalled body then lacks its last chunk, as it should)
            for i in range(0, len(data), 65536):
                piece = data[i:i + 65536]
                self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            if len(data) == len(self.whole):
                self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(data)
        self.wfile.flush()
        with lock:
            stats["sent"] += len(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def main():
    global args, rng, workers
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--p503", type=float, default=0)
    p.add_argument("--preset", type=float, default=0)
    p.add_argument("--ptrunc", type=float, default=0)
    p.add_argument("--pstall", type=float, default=0)
    p.add_argument("--stall-s", type=float, default=5)
    p.add_argument("--ttfb-ms", type=float, default=0)
    p.add_argument("--flip", default="")
    p.add_argument("--busy-503", type=int, default=0)
    p.add_argument("--stall-first", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-ranges", action="store_true")
    p.add_argument("--chunked", action="store_true")
    p.add_argument("--http10", action="store_true")
    p.add_argument("--max-concurrent", type=int, default=0)
    args = p.parse_args()
    if args.chunked and args.http10:
        p.error("--chunked and --http10 together: HTTP/1.0 has no chunked encoding")
    if args.max_concurrent > 0:
        workers = threading.Semaphore(args.max_concurrent)
    rng = random.Random(args.seed)
    if args.http10:
        Handler.protocol_version = "HTTP/1.0"
    srv = Server(("127.0.0.1", 0), Handler)
    print("port %d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
