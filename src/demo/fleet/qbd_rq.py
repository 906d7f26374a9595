"""The RQ side of `qbridge demo --framework rq`: a real RQ application
talking to Redis through qbridge's proxy. Written out by the demo and run as:

    python qbd_rq.py produce N            N enqueue();     prints job ids
    python qbd_rq.py schedule N SECONDS   N enqueue_in();  prints job ids
    python qbd_rq.py worker               the fleet's worker (with RQ's
                                          scheduler, which moves due jobs)

Each job tells the demo's ledger it ran (the stand-in for its side effect);
its on_success / on_failure callbacks report the outcome to qbridge
(POST /v1/outcomes), the way issue 15's reporter will.

Environment: QBD_REDIS_URL (the proxy), QBD_QUEUE (the RQ queue),
QBD_ROUTE_QUEUE (the route's Postgres queue), QBD_LEDGER, QBD_OUTCOMES.
"""

import datetime
import json
import os
import sys
import urllib.request

from redis import Redis
from rq import Callback, Queue, get_current_job
from rq.worker import SimpleWorker


def _post(url, body, headers=None):
    request = urllib.request.Request(url, data=body.encode(), method="POST")
    request.add_header("content-type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def answer(key):
    """What a job "returns": the response both sides' digests compare."""
    return json.dumps({"key": key, "ok": True}, separators=(",", ":"), sort_keys=True)


def deliver(n):
    key = get_current_job().id
    _post(os.environ["QBD_LEDGER"], "", {"qbridge-job-key": key, "qbd-side": "redis"})
    return n


def _report(key, outcome, detail):
    body = {"queue": os.environ["QBD_ROUTE_QUEUE"], "key": key, "outcome": outcome, "detail": detail}
    try:
        _post(os.environ["QBD_OUTCOMES"], json.dumps(body))
    except OSError as error:  # never fail the job for its report
        print(f"outcome report failed: {type(error).__name__}", file=sys.stderr)


def report_ok(job, connection, result, *args, **kwargs):
    _report(job.id, "ok", answer(job.id))


def report_failed(job, connection, type, value, traceback):
    _report(job.id, "failed", type.__name__)


def _queue():
    connection = Redis.from_url(os.environ["QBD_REDIS_URL"])
    return Queue(os.environ["QBD_QUEUE"], connection=connection)


def _callbacks():
    return {"on_success": Callback(report_ok), "on_failure": Callback(report_failed)}


if __name__ == "__main__":
    # The worker imports this module by name to find the functions.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import qbd_rq

    if sys.argv[1:2] == ["produce"]:
        queue = _queue()
        for i in range(int(sys.argv[2])):
            print(queue.enqueue(qbd_rq.deliver, i, **qbd_rq._callbacks()).id, flush=True)
    elif sys.argv[1:2] == ["schedule"]:
        queue = _queue()
        delay = datetime.timedelta(seconds=float(sys.argv[3]))
        for i in range(int(sys.argv[2])):
            print(queue.enqueue_in(delay, qbd_rq.deliver, i, **qbd_rq._callbacks()).id, flush=True)
    elif sys.argv[1:2] == ["worker"]:
        queue = _queue()
        SimpleWorker([queue], connection=queue.connection).work(with_scheduler=True)
    else:
        sys.exit("usage: produce N | schedule N SECONDS | worker")
