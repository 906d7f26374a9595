"""An RQ application for the integration tests (a copy of its own, not
examples/fleets/rq_app.py, the application the examples, the drill and
the fault test share: `structures` fails a job and schedules others with
RQ's own worker to fill RQ's registries, which that application never
does), with real RQ against QBT_BROKER (qbridge's proxy, or Redis itself) on the RQ queue QBT_QUEUE:

- `python rq_app.py produce N` enqueues N jobs of `rq_app.add` and prints
  each job's id, one per line. RQ writes the job hash `rq:job:<id>` and
  pushes the id in one MULTI.
- `python rq_app.py structures` puts jobs where RQ keeps them besides the
  list, with RQ's own code: one job that fails in a burst of RQ's
  SimpleWorker (the failed registry), two `enqueue_in` an hour ahead (the
  scheduled registry), then one job left waiting in the list. Prints the
  failed, scheduled and waiting ids, one per line, in that order.
"""

import os
import sys
from datetime import timedelta

from redis import Redis
from rq import Queue, SimpleWorker


def add(a, b):
    return a + b


def boom():
    raise RuntimeError("boom")


def structures():
    connection = Redis.from_url(os.environ["QBT_BROKER"])
    queue = Queue(os.environ["QBT_QUEUE"], connection=connection)
    failing = queue.enqueue("rq_app.boom")
    SimpleWorker([queue], connection=connection).work(burst=True, logging_level="ERROR")
    later = [queue.enqueue_in(timedelta(hours=1), "rq_app.add", i, i) for i in range(2)]
    waiting = queue.enqueue("rq_app.add", 5, 5)
    for job in [failing, *later, waiting]:
        print(job.id, flush=True)


def schedule(n, seconds):
    queue = Queue(os.environ["QBT_QUEUE"], connection=Redis.from_url(os.environ["QBT_BROKER"]))
    for i in range(n):
        job = queue.enqueue_in(timedelta(seconds=seconds), "rq_app.add", i, i)
        print(job.id, flush=True)


def unique(n, seconds=None):
    from rq.exceptions import DuplicateJobError

    queue = Queue(os.environ["QBT_QUEUE"], connection=Redis.from_url(os.environ["QBT_BROKER"]))
    prefix = os.urandom(6).hex()
    for i in range(n):
        job_id = f"u{prefix}-{i}"
        for attempt in range(2):
            try:
                if seconds is None:
                    queue.enqueue("rq_app.add", i, i, job_id=job_id, unique=True)
                else:
                    queue.enqueue_in(timedelta(seconds=seconds), "rq_app.add", i, i, job_id=job_id, unique=True)
            except DuplicateJobError:
                if attempt == 0:
                    sys.exit(f"{job_id}: refused as a duplicate on its first enqueue")
            else:
                if attempt == 1:
                    sys.exit(f"{job_id}: enqueued twice although unique")
        print(job_id, flush=True)


def scheduler():
    from rq.scheduler import RQScheduler

    connection = Redis.from_url(os.environ["QBT_BROKER"])
    pass_ = RQScheduler([os.environ["QBT_QUEUE"]], connection=connection)
    if not pass_.acquire_locks():
        sys.exit("another RQ scheduler holds the queue's lock")
    pass_.enqueue_scheduled_jobs()
    pass_.release_locks()


def produce(n):
    queue = Queue(os.environ["QBT_QUEUE"], connection=Redis.from_url(os.environ["QBT_BROKER"]))
    for i in range(n):
        job = queue.enqueue("rq_app.add", i, i * 2)
        print(job.id, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        produce(int(sys.argv[2]))
    elif sys.argv[1:2] == ["structures"]:
        structures()
    elif sys.argv[1:2] == ["schedule"]:
        schedule(int(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1:2] == ["unique"]:
        unique(int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else None)
    elif sys.argv[1:2] == ["scheduler"]:
        scheduler()
    else:
        sys.exit("usage: rq_app.py produce N | structures | schedule N SECONDS | unique N [SECONDS] | scheduler")
