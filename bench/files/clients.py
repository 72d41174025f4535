"""One timed upload, in a process of its own; prints one JSON line.

    .venv/bin/python bench/files/clients.py relaunch URL RUN PATH NAME
    bench/files/.venv/bin/python bench/files/clients.py ml-logger URL PATH KEY

``relaunch``: ``relaunch.upload_file`` (the project's .venv), timed from the
call until it returns, which is when the server has committed the file's
manifest (every chunk stored, with the server's durability: fsync by
default). ``ml-logger``: the client's fastest path, a pycurl multipart POST
of the file (``FORM_FILE``, what ``ml_logger``'s ``save_file`` sends), timed
from ``perform()`` until the server's response. Neither time includes the
interpreter's start or imports.
"""

from __future__ import annotations

import json
import sys
import time


def relaunch_upload(url: str, run: str, path: str, name: str) -> dict:
    import relaunch

    started = time.perf_counter()
    done = relaunch.upload_file(path, run, name, server=url)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "size": done.size,
        "sent_bytes": done.sent_bytes,
        "chunks": done.chunks,
        "sent_chunks": done.sent_chunks,
    }


def ml_logger_upload(url: str, path: str, key: str) -> dict:
    import io

    import pycurl

    body = io.BytesIO()
    c = pycurl.Curl()
    c.setopt(c.WRITEFUNCTION, body.write)
    c.setopt(c.URL, url)
    c.setopt(c.TIMEOUT, 3600)
    # ml_logger.log_client.LogClient.save_file, verbatim but for the response
    # sink: the file streamed from disk as one multipart part.
    c.setopt(
        c.HTTPPOST,
        [("file", (c.FORM_FILE, path, c.FORM_FILENAME, key, c.FORM_CONTENTTYPE, "plain/text"))],
    )
    started = time.perf_counter()
    c.perform()
    seconds = time.perf_counter() - started
    status = c.getinfo(c.RESPONSE_CODE)
    sent = c.getinfo(c.SIZE_UPLOAD_T)
    c.close()
    if status != 200:
        raise SystemExit(f"ml-logger's server answered {status}: {body.getvalue()[:500]!r}")
    reply = json.loads(body.getvalue())
    return {"seconds": seconds, "size": reply["length"], "sent_bytes": sent}


def main() -> None:
    kind, *args = sys.argv[1:]
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # pycurl: HTTPPOST, as ml-logger uses
    out = relaunch_upload(*args) if kind == "relaunch" else ml_logger_upload(*args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
