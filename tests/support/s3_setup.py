#!/usr/bin/env python3
"""Fills an S3 emulator the tests started on loopback, with boto3.

  s3_setup.py moto ENDPOINT ROOT    moto_server started with INITIAL_NO_AUTH_ACTION_COUNT:
                                    makes an IAM user with an s3:* + sts:AssumeRole policy
                                    and an access key, and the role sluice-reader (s3:*,
                                    assumable by anyone, also with a web identity), uploads
                                    ROOT, then turns signature checking on (POST
                                    /moto-api/reset-auth); prints "KEY SECRET".
  s3_setup.py moto-open ...         the same, signature checking left off.
  s3_setup.py s3rver ENDPOINT ROOT  s3rver (access key S3RVER): uploads ROOT.

Each directory directly under ROOT becomes a bucket; the files below it its objects,
keyed by their path relative to that directory.
"""
import json
import os
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config


def client(service, endpoint, key, secret):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 10},
                                      max_pool_connections=16))


def upload(s3, root):
    jobs = []
    for bucket in sorted(os.listdir(root)):
        base = os.path.join(root, bucket)
        s3.create_bucket(Bucket=bucket)
        for d, _, files in os.walk(base, followlinks=True):
            for f in files:
                path = os.path.join(d, f)
                jobs.append((bucket, os.path.relpath(path, base), path))

    def put(job):
        bucket, key, path = job
        with open(path, "rb") as fh:
            s3.put_object(Bucket=bucket, Key=key, Body=fh.read())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, jobs))


def main():
    kind, endpoint, root = sys.argv[1:4]
    if kind == "s3rver":
        upload(client("s3", endpoint, "S3RVER", "S3RVER"), root)
        print("S3RVER S3RVER")
        return
    iam = client("iam", endpoint, "AKIAROOTSETUP0000000", "setup-secret")
    iam.create_user(UserName="sluice")
    policy = iam.create_policy(PolicyName="sluice-s3", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}]}))
    iam.attach_user_policy(UserName="sluice", PolicyArn=policy["Policy"]["Arn"])
    key = iam.create_access_key(UserName="sluice")["AccessKey"]
    iam.create_role(RoleName="sluice-reader", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                       "Action": ["sts:AssumeRole", "sts:AssumeRoleWithWebIdentity"]}]}))
    reader = iam.create_policy(PolicyName="sluice-reader-s3", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    iam.attach_role_policy(RoleName="sluice-reader", PolicyArn=reader["Policy"]["Arn"])
    upload(client("s3", endpoint, "AKIAROOTSETUP0000000", "setup-secret"), root)
    if kind == "moto":
        req = urllib.request.Request(endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req).read()
    print(key["AccessKeyId"], key["SecretAccessKey"])


if __name__ == "__main__":
    main()
