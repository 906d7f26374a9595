"""The RQ side of `qbridge demo --framework rq`: a real RQ application
talking to Redis through qbridge's proxy. Written out by the demo and run as:

    python qbd_rq.py produce N            N enqueue();     prints job ids
    python qbd_rq.py schedule N SECONDS   N enqueue_in();  prints job ids
    python qbd_rq.py worker               the fleet's worker (a reporting
                                          SimpleWorker, with RQ's scheduler)
    python -m qbridge_adapters.runner rq --import qbd_rq ...
                                          the Postgres side's handler

The job function is the team's code, unchanged on both sides: it tells the
demo's ledger it ran (its side effect; QBD_SIDE says which side ran it), and
every fifth job fails its first attempt (the ledger says so) and is retried
(Retry(max=3)). In shadow, qbridge's runner calls its dry run instead.

Environment: QBD_REDIS_URL (the proxy), QBD_QUEUE (the RQ queue),
QBD_LEDGER, QBD_SIDE, and the fleet's QBRIDGE_* settings.
"""

import datetime
import os
import sys
import urllib.error
import urllib.request

from qbridge_adapters import shadow
from redis import Redis
from rq import Queue, Retry, get_current_job


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
    """What the job returns: the response both sides' digests compare."""
    return {"n": n, "ok": True}


@shadow(answer)
def deliver(n):
    key = get_current_job().id
    if n % 5 == 4:
        _ledger(key, flaky=True)
    _ledger(key)
    return answer(n)


def _queue():
    connection = Redis.from_url(os.environ["QBD_REDIS_URL"])
    return Queue(os.environ["QBD_QUEUE"], connection=connection)


if __name__ == "__main__":
    # The worker imports this module by name to find the functions.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import qbd_rq

    if sys.argv[1:2] == ["produce"]:
        queue = _queue()
        for i in range(int(sys.argv[2])):
            print(queue.enqueue(qbd_rq.deliver, i, retry=Retry(max=3)).id, flush=True)
    elif sys.argv[1:2] == ["schedule"]:
        queue = _queue()
        delay = datetime.timedelta(seconds=float(sys.argv[3]))
        for i in range(int(sys.argv[2])):
            print(queue.enqueue_in(delay, qbd_rq.deliver, i, retry=Retry(max=3)).id, flush=True)
    elif sys.argv[1:2] == ["worker"]:
        # The fleet's whole configuration for qbridge: its worker class.
        from qbridge_adapters.rq import ReportingSimpleWorker

        queue = _queue()
        ReportingSimpleWorker([queue], connection=queue.connection).work(with_scheduler=True)
    else:
        sys.exit("usage: produce N | schedule N SECONDS | worker")
