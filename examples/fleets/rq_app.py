"""An RQ application moving to qbridge. One line is qbridge's (marked), and the
worker class on the command line; the job function is the team's code,
unchanged except its shadow declaration.

    fleet:   QBRIDGE_OUTCOMES=http://127.0.0.1:8080 QBRIDGE_ROUTE=thumbnails \\
             PYTHONPATH=adapters/python:examples/fleets \\
             rq worker -w qbridge_adapters.rq.ReportingWorker thumbnails
    runner:  PYTHONPATH=adapters/python:examples/fleets \\
             python -m qbridge_adapters.runner rq --import rq_app --listen 127.0.0.1:8093
    produce: REDIS_URL=redis://127.0.0.1:6380/0 PYTHONPATH=adapters/python:examples/fleets \\
             python examples/fleets/rq_app.py 10
             (or: produce N; schedule N SECONDS, enqueue_in each; worker,
             a reporting SimpleWorker with RQ's scheduler)

It is also the application `qbridge demo --framework rq` runs (the binary
embeds this file) and the one the integration tests drive, through its
environment:

    REDIS_URL         Redis (default redis://127.0.0.1:6379/0)
    QUEUE_NAME        the RQ queue (default thumbnails)
    RQ_KEY_PREFIX     RQ 3's own: its keys' prefix instead of rq (the
                      route's key_prefix)
    LEDGER_URL        where the job says it ran (the drill's ledger, its
                      stand-in for storing the file); LEDGER_SIDE names the side
"""

import datetime
import os
import sys
import urllib.error
import urllib.request

from qbridge_adapters import shadow  # qbridge
from redis import Redis
from rq import Queue, Retry, get_current_job


class StoreFailed(ConnectionError):
    """The file was not stored this time: the job's Retry runs it again."""


def _size(image_id):
    return {"image": image_id, "size": [128, 128]}


def _store(job_id, image_id):
    """The job's side effect. Here, without a ledger, nothing; with one (the
    drill), it tells the ledger the job ran, and every fifth job's first
    try fails (the ledger answers 409) and is retried."""
    ledger = os.environ.get("LEDGER_URL")
    if not ledger:
        return
    headers = {"qbridge-job-key": job_id, "qbd-side": os.environ.get("LEDGER_SIDE", "redis")}
    tries = [dict(headers, **{"qbd-flaky": "1"}), headers] if image_id % 5 == 4 else [headers]
    for sent in tries:
        request = urllib.request.Request(ledger, data=b"", method="POST", headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as error:
            if error.code == 409:
                raise StoreFailed() from None
            raise


@shadow(_size)  # in shadow, qbridge's runner calls _size: the same answer, no file
def make_thumbnail(image_id):
    # resize the image here; then store it (the side effect)
    _store(get_current_job().id, image_id)
    return _size(image_id)


def _queue():
    connection = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    return Queue(os.environ.get("QUEUE_NAME", "thumbnails"), connection=connection)


if __name__ == "__main__":
    # RQ finds the function by this module's name, as a worker imports it.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rq_app

    args = sys.argv[1:]
    if args[:1] == ["worker"]:
        from qbridge_adapters.rq import ReportingSimpleWorker

        queue = _queue()
        ReportingSimpleWorker([queue], connection=queue.connection).work(with_scheduler=True)
    elif args[:1] == ["schedule"]:
        queue, delay = _queue(), datetime.timedelta(seconds=float(args[2]))
        for i in range(int(args[1])):
            print(queue.enqueue_in(delay, rq_app.make_thumbnail, i, retry=Retry(max=3)).id, flush=True)
    elif args[:1] == ["produce"] or not args or args[0].isdigit():
        queue = _queue()
        for i in range(int(args[-1]) if args and args[-1].isdigit() else 10):
            print(queue.enqueue(rq_app.make_thumbnail, i, retry=Retry(max=3)).id, flush=True)
    else:
        sys.exit("usage: rq_app.py [produce] N | schedule N SECONDS | worker")
