"""What the adapters' tests share: a stand-in for qbridge's HTTP listener
(the tests read what a reporter sent), the test's Redis and database, and
a route of a test's own."""

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis

from qbridge_adapters import Settings

REDIS_URL = os.environ.get("QBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
DATABASE_URL = os.environ.get("QBRIDGE_TEST_DATABASE_URL")


class Listener:
    """A stand-in for qbridge's HTTP listener that records each POST."""

    def __init__(self, status=201, delay=0.0):
        self.requests = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                listener.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
                time.sleep(delay)
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()


def settings(outcomes, token=None):
    route = "pyt" + uuid.uuid4().hex[:10]
    return Settings(outcomes=outcomes, route=route, queue=route, token=token, redis_url=REDIS_URL)


def ran(s):
    return set(k.decode() for k in redis.Redis.from_url(REDIS_URL).zrange(s.ran_key, 0, -1))


def sent(listener):
    """Every outcome the listener received, in order."""
    return [entry for _, _, batch in listener.requests for entry in batch]


def wait_until(what, check, timeout=30.0):
    """Polls ``check`` until it is true; fails naming ``what`` after
    ``timeout`` seconds."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
