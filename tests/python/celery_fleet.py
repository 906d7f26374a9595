"""A Celery application for the integration tests: producers call
`python celery_fleet.py produce N [PRIORITY]` (through qbridge's proxy),
`python celery_fleet.py produce_in N SECONDS` (countdown tasks) or
`python celery_fleet.py produce_retry ID RETRIES SECONDS` (a retry's push), and a real
Celery worker runs `celery -A celery_fleet worker` against Redis itself.

Every task run appends "<task id> <args>" to the Redis list named by
QBT_LEDGER on the real Redis (QBT_LEDGER_URL): the ledger the tests count
runs in, written by the task code itself.

A copy of its own, not examples/fleets/celery_app.py (the application the
examples, the drill and the fault test share): the tests count runs in a
Redis list they read themselves, send tasks with priorities and re-send a
task as Celery's own retry does (`produce_retry`) — what they assert is
about those messages, which no application sends on purpose.

Environment: QBT_BROKER (the broker URL: the proxy for producers, Redis for
the worker), QBT_QUEUE (the Celery queue, i.e. the Redis list), QBT_LEDGER,
QBT_LEDGER_URL.
"""

import os
import sys

import redis
from celery import Celery

app = Celery("celery_fleet", broker=os.environ["QBT_BROKER"])
app.conf.task_default_queue = os.environ["QBT_QUEUE"]
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
app.conf.task_acks_late = False

_ledger = redis.Redis.from_url(os.environ["QBT_LEDGER_URL"])


@app.task(name="qbt.add", bind=True)
def add(self, a, b):
    _ledger.rpush(os.environ["QBT_LEDGER"], f"{self.request.id} {a} {b}")
    return a + b


def produce(n, priority=None):
    """Sends n tasks (with a priority when given) and prints their ids, one
    per line."""
    for i in range(n):
        if priority is None:
            result = add.delay(i, i)
        else:
            result = add.apply_async((i, i), priority=priority)
        print(result.id, flush=True)


def produce_in(n, seconds):
    """Sends n tasks due in `seconds` (a countdown: a worker takes them at
    once and holds them, unacked, until their ETA) and prints their ids."""
    for i in range(n):
        print(add.apply_async((i, i), countdown=seconds).id, flush=True)


def produce_retry(task_id, retries, seconds):
    """Sends task `task_id` again the way Celery's `Task.retry` does: the
    same id, its `retries` header counting the retries so far, due in
    `seconds`. Prints the id."""
    print(add.apply_async((1, 1), task_id=task_id, retries=retries, countdown=seconds).id, flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["produce_retry"]:
    produce_retry(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
elif __name__ == "__main__" and sys.argv[1:2] == ["produce"]:
    produce(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
elif __name__ == "__main__" and sys.argv[1:2] == ["produce_in"]:
    produce_in(int(sys.argv[2]), int(sys.argv[3]))
