"""The Celery side of `qbridge demo --framework celery`: a real Celery 5
application (kombu's Redis transport) talking to Redis through qbridge's
proxy. Written out by the demo and run as:

    python qbd_celery.py produce N            N delay();    prints task ids
    python qbd_celery.py schedule N SECONDS   N countdown;  prints task ids
    python -m celery -A qbd_celery worker ... the fleet's worker
    python -m qbridge_adapters.runner celery --app qbd_celery:app ...
                                              the Postgres side's handler

The task is the team's code, unchanged on both sides: it tells the demo's
ledger it ran (its side effect; QBD_SIDE says which side ran it), and every
fifth job fails its first attempt (the ledger says so) and is retried. The
fleet reports outcomes with qbridge_adapters.celery.report_outcomes; in
shadow, qbridge's runner calls the task's dry run instead.

Environment: QBD_REDIS_URL (the proxy), QBD_QUEUE (the Celery queue),
QBD_LEDGER, QBD_SIDE, and the fleet's QBRIDGE_* settings.
"""

import os
import sys
import urllib.error
import urllib.request

from celery import Celery

app = Celery("qbd_celery", broker=os.environ["QBD_REDIS_URL"])
app.conf.task_default_queue = os.environ["QBD_QUEUE"]
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False

if os.environ.get("QBRIDGE_OUTCOMES"):
    # The fleet's whole configuration for qbridge: one line.
    from qbridge_adapters.celery import report_outcomes

    report_outcomes(app)


class Flaky(Exception):
    """A first attempt that fails (the ledger decides which)."""


def _ledger(key, flaky=False):
    request = urllib.request.Request(os.environ["QBD_LEDGER"], data=b"", method="POST")
    request.add_header("qbridge-job-key", key)
    request.add_header("qbd-side", os.environ.get("QBD_SIDE", "redis"))
    if flaky:
        request.add_header("qbd-flaky", "1")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except urllib.error.HTTPError as error:
        if error.code == 409:
            raise Flaky() from None
        raise


def answer(n):
    """What the task returns: the response both sides' digests compare."""
    return {"n": n, "ok": True}


@app.task(name="qbd.deliver", bind=True, autoretry_for=(Flaky,), max_retries=3,
          default_retry_delay=1, qbridge_shadow=lambda n: answer(n))
def deliver(self, n):
    if n % 5 == 4:
        _ledger(self.request.id, flaky=True)
    _ledger(self.request.id)
    return answer(n)


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        for i in range(int(sys.argv[2])):
            print(deliver.delay(i).id, flush=True)
    elif sys.argv[1:2] == ["schedule"]:
        for i in range(int(sys.argv[2])):
            print(deliver.apply_async((i,), countdown=float(sys.argv[3])).id, flush=True)
    else:
        sys.exit("usage: produce N | schedule N SECONDS")
