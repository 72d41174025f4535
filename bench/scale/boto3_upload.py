"""The peer of the S3 upload figure: one `boto3` `upload_file` straight into
the bucket, in a process of its own; prints one JSON line.

    .venv/bin/python bench/scale/boto3_upload.py PATH BUCKET KEY

Credentials, region and endpoint from the AWS_* variables. boto3's defaults
(`TransferConfig()`: multipart above 8 MiB, 8 MiB parts, 10 threads), as a
user calls it; timed from the call until it returns (S3 answered the
multipart upload's completion). No interpreter start or import is timed.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    path, bucket, key = sys.argv[1:]
    import boto3

    s3 = boto3.client("s3")
    started = time.perf_counter()
    s3.upload_file(path, bucket, key)
    seconds = time.perf_counter() - started
    size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    assert size == os.path.getsize(path), (size, path)
    print(json.dumps({"seconds": seconds, "size": size, "sent_bytes": size}), flush=True)


if __name__ == "__main__":
    main()
