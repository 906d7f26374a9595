"""The Celery side of `qbridge demo --framework celery`: a real Celery 5
application (kombu's Redis transport) talking to Redis through qbridge's
proxy. Written out by the demo and run as:

    python qbd_celery.py produce N            N delay();    prints task ids
    python qbd_celery.py schedule N SECONDS   N countdown;  prints task ids
    python -m celery -A qbd_celery worker ... the fleet's worker

Each task tells the demo's ledger it ran (the stand-in for its side
effect); task_success / task_failure handlers report the outcome to qbridge
(POST /v1/outcomes), the way issue 15's reporter will.

Environment: QBD_REDIS_URL (the proxy), QBD_QUEUE (the Celery queue),
QBD_ROUTE_QUEUE (the route's Postgres queue), QBD_LEDGER, QBD_OUTCOMES.
"""

import json
import os
import sys
import urllib.request

from celery import Celery
from celery.signals import task_failure, task_success

app = Celery("qbd_celery", broker=os.environ["QBD_REDIS_URL"])
app.conf.task_default_queue = os.environ["QBD_QUEUE"]
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False


def _post(url, body, headers=None):
    request = urllib.request.Request(url, data=body.encode(), method="POST")
    request.add_header("content-type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def answer(key):
    """What a task "returns": the response both sides' digests compare."""
    return json.dumps({"key": key, "ok": True}, separators=(",", ":"), sort_keys=True)


@app.task(name="qbd.deliver", bind=True)
def deliver(self, n):
    _post(os.environ["QBD_LEDGER"], "", {"qbridge-job-key": self.request.id, "qbd-side": "redis"})
    return n


def _report(key, outcome, detail):
    body = {"queue": os.environ["QBD_ROUTE_QUEUE"], "key": key, "outcome": outcome, "detail": detail}
    try:
        _post(os.environ["QBD_OUTCOMES"], json.dumps(body))
    except OSError as error:  # never fail the task for its report
        print(f"outcome report failed: {type(error).__name__}", file=sys.stderr)


@task_success.connect
def _ok(sender=None, **_):
    _report(sender.request.id, "ok", answer(sender.request.id))


@task_failure.connect
def _failed(sender=None, task_id=None, exception=None, **_):
    _report(task_id, "failed", type(exception).__name__)


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        for i in range(int(sys.argv[2])):
            print(deliver.delay(i).id, flush=True)
    elif sys.argv[1:2] == ["schedule"]:
        for i in range(int(sys.argv[2])):
            print(deliver.apply_async((i,), countdown=float(sys.argv[3])).id, flush=True)
    else:
        sys.exit("usage: produce N | schedule N SECONDS")
