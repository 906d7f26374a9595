#!/usr/bin/env python3
"""A job handler for qbridge's `http` handler type that honours shadow mode.

qbridge POSTs each job's payload with headers such as Qbridge-Job-Key and
Qbridge-Mode. In `live` mode this handler performs its side effect (one line
"<job key>" appended to the LEDGER file); in `shadow` mode (the Postgres side
re-running a job whose live run happened on Redis) it computes the same
answer and does NOT touch the ledger. The answer is JSON
{"ok": true, "key": ..., "processed_at": ...}; "processed_at" differs on
every call, so list it in [routes.diff] ignore_fields.

    LEDGER=./ledger.txt PORT=8080 python3 examples/python/handler.py

Environment: HOST (default 127.0.0.1), PORT (default 8080; 0 picks a free
port), LEDGER (default ./ledger.txt). Standard library only. Payloads are never logged.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LEDGER = os.environ.get("LEDGER", "./ledger.txt")
PORT = int(os.environ.get("PORT", "8080"))
# 127.0.0.1 by default; a container sets HOST=0.0.0.0 (docker-compose.yml).
HOST = os.environ.get("HOST", "127.0.0.1")

# One writer at a time, so two concurrent jobs never interleave their lines.
ledger_lock = threading.Lock()


def side_effect(key):
    """The job's real work; here, a line in the ledger. Live mode only."""
    with ledger_lock, open(LEDGER, "a", encoding="utf-8") as ledger:
        ledger.write(key + "\n")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        # Read (and here ignore) the payload so the connection stays sane.
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)

        key = self.headers.get("Qbridge-Job-Key")
        mode = self.headers.get("Qbridge-Mode", "live")
        if not key:
            # 4xx is a permanent failure for qbridge: retrying will not help.
            self.answer(400, {"ok": False, "error": "missing Qbridge-Job-Key"})
            return
        if mode != "shadow":
            side_effect(key)
        # The same answer in both modes: qbridge compares the digests of the
        # live (Redis side) and shadow (Postgres side) responses.
        self.answer(200, {"ok": True, "key": key, "processed_at": time.time()})

    def do_GET(self):
        # A health check for whoever starts this process.
        self.answer(200, {"ok": True})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):
        # No per-request log: job keys and payloads stay out of the output.
        pass


def main():
    server = ThreadingHTTPServer((HOST, PORT), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"handler listening on http://{host}:{port}/ (ledger: {LEDGER})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
