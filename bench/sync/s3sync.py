"""The boto3 peer of the sync benchmark: what `aws s3 sync SRC s3://BUCKET/PREFIX`
does, with boto3: list the prefix, upload each local file that is missing
there, or differs in size, or is newer than the object (10 threads, boto3's
`upload_file` defaults).

    .venv/bin/python bench/sync/s3sync.py SRC BUCKET PREFIX

Credentials and endpoint from the AWS_* variables (SeaweedFS in the
benchmark). Prints one JSON line: files uploaded and unchanged.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    src, bucket, prefix = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    import boto3

    s3 = boto3.client("s3")
    remote = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            remote[obj["Key"]] = (obj["Size"], obj["LastModified"].timestamp())
    todo = []
    unchanged = 0
    for path in src.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        key = prefix + path.relative_to(src).as_posix()
        stat = path.stat()
        known = remote.get(key)
        if known is not None and known[0] == stat.st_size and stat.st_mtime <= known[1]:
            unchanged += 1
        else:
            todo.append((path, key))
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(lambda job: s3.upload_file(str(job[0]), bucket, job[1]), todo))
    print(json.dumps({"uploaded": len(todo), "unchanged": unchanged}))


if __name__ == "__main__":
    main()
