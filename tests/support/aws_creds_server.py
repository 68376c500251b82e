#!/usr/bin/env python3
"""sluice's test server for AWS credentials that expire (loopback only).

It hands out short-lived credentials the way a cloud node gets them, and serves S3 objects
only to requests signed (SigV4, checked here independently of curl) with credentials it
handed out and that have not expired:
  PUT /latest/api/token                           IMDSv2 session token (needs the TTL header)
  GET /latest/meta-data/iam/security-credentials/ the role's name (needs the token)
  GET /latest/meta-data/iam/security-credentials/sluice-role   the role's credentials
  GET /container-credentials                      ECS / EKS Pod Identity credentials
  POST /  Action=AssumeRoleWithWebIdentity        STS (unsigned, as AWS has it)
  GET /BUCKET/KEY                                 the file ROOT/BUCKET/KEY (path style, Range)
  GET /__stats                                    JSON: credentials issued, objects served,
                                                  refusals by code

Options:
  --ttl S              credentials stop working S seconds after they are issued
  --claimed-ttl S      the Expiration they carry says S seconds (default: --ttl); longer
                       than --ttl, it makes S3 refuse them early with ExpiredToken
  --ttfb-ms MS         wait before each object's answer
  --container-token T  the Authorization the container endpoint wants (default: none)
  --web-token T        the WebIdentityToken STS wants
  --refuse-role        the role request answers 401 whatever the token
  --secrets FILE       append every secret key, session token and IMDS token issued, and
                       the container and web-identity tokens given, one per line (tests
                       check that none appears in sluice's messages or figures)
It listens on 127.0.0.1 on a free port and prints "port N" once it accepts connections.
Stop it by pid.
"""
import argparse
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = None
lock = threading.Lock()
issued = {}  # access key -> (secret, token, valid_until)
imds_tokens = set()
stats = {"issued": 0, "served": 0, "refused": {}, "imds_token_requests": 0}


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def remember(secret):
    """Adds a secret or token to --secrets (call with the lock held)."""
    if args.secrets:
        with open(args.secrets, "a") as f:
            f.write(secret + "\n")


def issue():
    now = time.time()
    key = "ASIA" + secrets.token_hex(8).upper()
    secret = secrets.token_urlsafe(30)
    token = secrets.token_urlsafe(60)
    with lock:
        issued[key] = (secret, token, now + args.ttl)
        stats["issued"] += 1
        remember(secret)
        remember(token)
    claimed = args.claimed_ttl if args.claimed_ttl is not None else args.ttl
    return key, secret, token, iso(now + claimed)


def hmac_sha256(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,\s*"
                  r"SignedHeaders=([^,]+),\s*Signature=([0-9a-f]{64})$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def reply(self, status, body, ctype="application/xml", headers=()):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def refuse(self, status, code, message="refused"):
        with lock:
            stats["refused"][code] = stats["refused"].get(code, 0) + 1
        self.reply(status, '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>'
                           '<RequestId>test</RequestId></Error>' % (code, message))

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def check_signature(self, service, body):
        """None when the request is signed with live credentials; else (status, code)."""
        m = AUTH.match(self.headers.get("Authorization", ""))
        if not m:
            return 403, "AccessDenied"
        key, date, region, svc, signed, signature = m.groups()
        with lock:
            cred = issued.get(key)
        if cred is None:
            return 403, "InvalidAccessKeyId"
        secret, token, valid_until = cred
        if time.time() >= valid_until:
            return 400, "ExpiredToken"
        if self.headers.get("x-amz-security-token") != token:
            return 400, "InvalidToken"
        if svc != service:
            return 403, "SignatureDoesNotMatch"
        path, _, query = self.path.partition("?")
        pairs = sorted(p if "=" in p else p + "=" for p in query.split("&") if p)
        names = signed.split(";")
        canon_headers = "".join("%s:%s\n" % (h, " ".join((self.headers.get(h) or "").split())) for h in names)
        payload = self.headers.get("x-amz-content-sha256") or hashlib.sha256(body).hexdigest()
        creq = "\n".join([self.command, path, "&".join(pairs), canon_headers, signed, payload])
        amz_date = self.headers.get("x-amz-date", "")
        scope = "%s/%s/%s/aws4_request" % (date, region, svc)
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
        k = hmac_sha256(("AWS4" + secret).encode(), date)
        k = hmac_sha256(k, region)
        k = hmac_sha256(k, svc)
        k = hmac_sha256(k, "aws4_request")
        if not hmac.compare_digest(hmac.new(k, sts.encode(), hashlib.sha256).hexdigest(), signature):
            return 403, "SignatureDoesNotMatch"
        return None

    def do_PUT(self):
        self.read_body()
        if self.path != "/latest/api/token":
            return self.reply(404, "", "text/plain")
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.reply(400, "", "text/plain")
        t = secrets.token_urlsafe(24)
        with lock:
            imds_tokens.add(t)
            stats["imds_token_requests"] += 1
            remember(t)
        self.reply(200, t, "text/plain")

    def do_POST(self):
        body = self.read_body()
        form = dict(urllib.parse.parse_qsl(body.decode()))
        if form.get("Action") != "AssumeRoleWithWebIdentity":
            return self.reply(400, "<ErrorResponse><Error><Code>InvalidAction</Code></Error></ErrorResponse>")
        if not form.get("RoleArn") or not form.get("RoleSessionName") or form.get("Version") != "2011-06-15":
            return self.reply(400, "<ErrorResponse><Error><Code>MissingParameter</Code></Error></ErrorResponse>")
        if form.get("WebIdentityToken") != args.web_token:
            return self.reply(400, "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>"
                                   "<Message>Couldn't verify the token</Message></Error>"
                                   "<RequestId>sts-test</RequestId></ErrorResponse>")
        key, secret, token, exp = issue()
        self.reply(200, "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
                        "<AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey>"
                        "<SessionToken>%s</SessionToken><Expiration>%s</Expiration></Credentials>"
                        "</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
                        % (key, secret, token, exp))

    def creds_json(self):
        key, secret, token, exp = issue()
        return json.dumps({"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": key, "SecretAccessKey": secret,
                           "Token": token, "Expiration": exp})

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        if self.path.startswith("/__stats"):
            with lock:
                return self.reply(200, json.dumps(stats, separators=(",", ":")), "application/json")
        if self.path.startswith("/latest/meta-data/iam/security-credentials/"):
            with lock:
                known = self.headers.get("X-aws-ec2-metadata-token") in imds_tokens
            if not known or args.refuse_role:
                return self.reply(401, "", "text/plain")
            role = self.path[len("/latest/meta-data/iam/security-credentials/"):]
            if role == "":
                return self.reply(200, "sluice-role", "text/plain")
            if role != "sluice-role":
                return self.reply(404, "", "text/plain")
            return self.reply(200, self.creds_json(), "application/json")
        if self.path == "/container-credentials":
            if args.container_token is not None and self.headers.get("Authorization") != args.container_token:
                return self.reply(401, json.dumps({"message": "unauthorized"}), "application/json")
            return self.reply(200, self.creds_json(), "application/json")
        bad = self.check_signature("s3", b"")
        if bad:
            return self.refuse(*bad)
        path = urllib.parse.unquote(self.path.partition("?")[0]).lstrip("/")
        full = os.path.normpath(os.path.join(args.root, path))  # links under ROOT followed, ".." not
        if not full.startswith(os.path.normpath(args.root) + os.sep) or not os.path.isfile(full):
            return self.refuse(404, "NoSuchKey")
        with open(full, "rb") as f:
            data = f.read()
        if args.ttfb_ms:
            time.sleep(args.ttfb_ms / 1000)
        headers = [("ETag", '"%d"' % len(data))]
        status = 200
        rng = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if rng and data:
            a = int(rng.group(1))
            b = min(int(rng.group(2)) if rng.group(2) else len(data) - 1, len(data) - 1)
            headers.append(("Content-Range", "bytes %d-%d/%d" % (a, b, len(data))))
            data = data[a:b + 1]
            status = 206
        with lock:
            stats["served"] += 1
        self.reply(status, data, "application/octet-stream", headers)


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--ttl", type=float, default=3600)
    p.add_argument("--claimed-ttl", type=float, default=None)
    p.add_argument("--ttfb-ms", type=float, default=0)
    p.add_argument("--container-token", default=None)
    p.add_argument("--web-token", default="web-identity-token")
    p.add_argument("--refuse-role", action="store_true")
    p.add_argument("--secrets", default=None)
    args = p.parse_args()
    for given in (args.container_token, args.web_token):  # the tokens sluice sends
        if given:
            remember(given)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    print("port %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
