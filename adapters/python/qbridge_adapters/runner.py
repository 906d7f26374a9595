"""The Postgres side's task runner: qbridge's handler for a route whose
payloads are a framework's messages, running the team's own task code.

    python -m qbridge_adapters.runner celery --app myproj.celery:app [--listen 127.0.0.1:8090]
    python -m qbridge_adapters.runner rq [--import myproj.jobs] [--redis-url URL] [--listen ...]

As an ``http`` handler (``handler = { type = "http", url = "http://127.0.0.1:8090/" }``)
it serves qbridge's POSTs; with ``--command`` it runs one job from stdin and
exits (``handler = { type = "command", program = "python", args = ["-m",
"qbridge_adapters.runner", "celery", "--app", "…", "--command"],
permanent_exit_codes = [65] }``): exit 0 done, 75 retry, 65 failed for good.

``Qbridge-Mode: shadow`` (``QBRIDGE_MODE`` for a command) runs the task's
declared shadow behaviour instead of the task (see ``shadow_mode``). Nothing here
logs a payload or an error's message.
"""

import argparse
import importlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .answer import Outcome

EXIT_RETRY = 75
EXIT_DEAD = 65


def _load(spec):
    """``module:attribute`` (or a module) imported."""
    module, _, attr = spec.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


def make_runner(args):
    """A function (payload, mode, attempt, key) -> (status, body)."""
    sys.path.insert(0, os.getcwd())
    for spec in args.imports or []:
        _load(spec)
    if args.framework == "celery":
        from . import celery as adapter

        if not args.app:
            raise SystemExit("qbridge runner: celery needs --app module:attribute (the Celery app)")
        app = _load(args.app)
        return lambda payload, mode, attempt, key: adapter.run_job(app, payload, mode, attempt, key)
    from redis import Redis

    from . import rq as adapter

    connection = Redis.from_url(args.redis_url) if args.redis_url else None
    return lambda payload, mode, attempt, key: adapter.run_job(connection, payload, mode, attempt, key)


def run_one(runner, body, mode, attempt, key):
    """One job: (status, body text). Never raises."""
    if mode not in ("live", "shadow"):
        return 400, "Qbridge-Mode must be live or shadow"
    try:
        payload = json.loads(body or b"null")
        if not isinstance(payload, dict):
            raise Outcome(422, "the job's payload is not a JSON object")
        return runner(payload, mode, attempt, key)
    except Outcome as outcome:
        return outcome.status, outcome.body
    except Exception as error:  # noqa: BLE001 - a fault of the runner itself: retry
        return 503, type(error).__name__


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - http.server's name
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        mode = (self.headers.get("qbridge-mode") or "live").lower()
        attempt = int(self.headers.get("qbridge-attempt") or 1)
        key = self.headers.get("qbridge-job-key") or ""
        status, text = run_one(self.server.runner, body, mode, attempt, key)
        data = text.encode() if status != 204 else b""
        self.send_response(status)
        if status != 204:
            self.send_header("content-type", "application/json" if status < 300 else "text/plain")
            self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_):
        pass  # a request line names nothing useful, and nothing personal is logged


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m qbridge_adapters.runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=["celery", "rq"])
    parser.add_argument("--app", help="celery: the Celery app, module:attribute")
    parser.add_argument("--import", dest="imports", action="append", help="a module to import first (repeatable)")
    parser.add_argument("--redis-url", help="rq: the Redis the jobs' code may use (default: RQ's)")
    parser.add_argument("--listen", default="127.0.0.1:8090", help="host:port (default 127.0.0.1:8090)")
    parser.add_argument("--command", action="store_true", help="run one job from stdin and exit")
    args = parser.parse_args(argv)
    runner = make_runner(args)
    if args.command:
        status, text = run_one(
            runner,
            sys.stdin.buffer.read(),
            os.environ.get("QBRIDGE_MODE", "live"),
            int(os.environ.get("QBRIDGE_ATTEMPT") or 1),
            os.environ.get("QBRIDGE_JOB_KEY", ""),
        )
        if status < 300:
            sys.stdout.write(text)
            return 0
        sys.stderr.write(text + "\n")
        return EXIT_RETRY if status >= 500 else EXIT_DEAD
    host, _, port = args.listen.rpartition(":")
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), _Handler)
    server.runner = runner
    server.daemon_threads = True
    print(f"qbridge runner ({args.framework}) listening on {args.listen}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
