"""The RQ application of `qbridge survey`'s tests, with RQ's own code on the
Redis at QBT_BROKER, queue "reports". Every job's arguments carry QBT_MARK
(the tests assert it never reaches the survey's output).

`python survey_rq.py fill`: one job that fails in a burst of RQ's
SimpleWorker (the failed registry), two `enqueue_in` an hour ahead (the
scheduled registry), two jobs left waiting in the list.
"""

import os
import sys
from datetime import timedelta

from redis import Redis
from rq import Queue, SimpleWorker


def echo(mark, n):
    return n


def boom(mark):
    raise RuntimeError("boom")


def fill():
    connection = Redis.from_url(os.environ["QBT_BROKER"])
    queue = Queue("reports", connection=connection)
    mark = os.environ["QBT_MARK"]
    queue.enqueue("survey_rq.boom", mark)
    SimpleWorker([queue], connection=connection).work(burst=True, logging_level="ERROR")
    for i in range(2):
        queue.enqueue_in(timedelta(hours=1), "survey_rq.echo", mark, i)
    for i in range(2):
        queue.enqueue("survey_rq.echo", mark, i)


if __name__ == "__main__":
    if sys.argv[1:2] == ["fill"]:
        fill()
    else:
        sys.exit("usage: survey_rq.py fill")
