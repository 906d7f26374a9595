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
    else:
        sys.exit("usage: rq_app.py produce N | structures")
