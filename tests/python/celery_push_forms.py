"""The ways kombu's Redis transport pushes a Celery task, with real Celery
and kombu against QBT_BROKER (qbridge's proxy), on the queue QBT_QUEUE:

- `python celery_push_forms.py expiring N`: the queue is declared with
  `expires` (kombu's `x-expires`), so each send is one MULTI of an LPUSH
  and a PEXPIRE per priority list (kombu 5.7's `_put`).
- `python celery_push_forms.py batch N`: N sends inside kombu's
  `Producer.batch()` (kombu 5.7+): LPUSHes buffered into one pipeline
  without MULTI, flushed at the end of the block.

Prints each task id, one per line. No worker runs: the tasks wait in
Redis's list, where the test counts them.
"""

import os
import sys

from celery import Celery
from kombu import Queue

QUEUE = os.environ["QBT_QUEUE"]

app = Celery("celery_push_forms", broker=os.environ["QBT_BROKER"])
app.conf.task_default_queue = QUEUE
app.conf.broker_connection_retry_on_startup = True


@app.task(name="qbt.push_forms.add")
def add(a, b):
    return a + b


def expiring(n):
    app.conf.task_queues = [Queue(QUEUE, expires=60)]
    for i in range(n):
        print(add.apply_async((i, i), queue=QUEUE).id, flush=True)


def batch(n):
    with app.producer_or_acquire() as producer:
        with producer.batch():
            ids = [add.apply_async((i, i), producer=producer).id for i in range(n)]
    for task_id in ids:
        print(task_id, flush=True)


if __name__ == "__main__":
    forms = {"expiring": expiring, "batch": batch}
    if len(sys.argv) != 3 or sys.argv[1] not in forms:
        sys.exit("usage: celery_push_forms.py expiring|batch N")
    forms[sys.argv[1]](int(sys.argv[2]))
