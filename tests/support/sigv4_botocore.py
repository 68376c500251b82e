#!/usr/bin/env python3
"""The SigV4 signature botocore (the AWS SDK for Python) computes for an S3 GET: an
implementation independent of curl's, to check sluice's signed requests against.

  sigv4_botocore.py URL AMZ_DATE KEY SECRET REGION PAYLOAD_HASH [SESSION_TOKEN]

Signs the headers curl signs (host, x-amz-content-sha256, x-amz-date and, with a token,
x-amz-security-token) and prints "SIGNED_HEADERS SIGNATURE".
"""
import sys
from urllib.parse import urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def main():
    url, amz_date, key, secret, region, payload = sys.argv[1:7]
    token = sys.argv[7] if len(sys.argv) > 7 else None
    headers = {"host": urlsplit(url).netloc, "x-amz-date": amz_date, "x-amz-content-sha256": payload}
    if token:
        headers["x-amz-security-token"] = token
    request = AWSRequest(method="GET", url=url, headers=headers)
    request.context["timestamp"] = amz_date
    auth = S3SigV4Auth(Credentials(key, secret, token), "s3", region)
    canonical = auth.canonical_request(request)
    signature = auth.signature(auth.string_to_sign(request, canonical), request)
    print(auth.signed_headers(auth.headers_to_sign(request)), signature)


if __name__ == "__main__":
    main()
