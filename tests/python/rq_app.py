"""An RQ application for the integration tests: `python rq_app.py produce N`
enqueues N jobs of `rq_app.add` with real RQ through QBT_BROKER (qbridge's
proxy) on the RQ queue QBT_QUEUE, and prints each job's id, one per line.
RQ writes the job hash `rq:job:<id>` and pushes the id in one MULTI.
"""

import os
import sys

from redis import Redis
from rq import Queue


def add(a, b):
    return a + b


def produce(n):
    queue = Queue(os.environ["QBT_QUEUE"], connection=Redis.from_url(os.environ["QBT_BROKER"]))
    for i in range(n):
        job = queue.enqueue("rq_app.add", i, i * 2)
        print(job.id, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        produce(int(sys.argv[2]))
    else:
        sys.exit("usage: rq_app.py produce N")
