"""A message kombu's Redis transport took with ack emulation and gives back,
with real Celery and kombu against QBT_BROKER (qbridge's proxy), on the
queue QBT_QUEUE:

- `python kombu_restore.py send`: sends one task; prints its id.
- `python kombu_restore.py take-and-restore`: takes one message without
  acking it (kombu keeps it in its `unacked` hash), prints `taken <id>`,
  waits for a line on stdin, then gives it back as a worker's warm
  shutdown does (`QoS.restore_unacked`: WATCH, HGET, then a MULTI of
  ZREM, HDEL and the push) and prints `restored`.
"""

import os
import sys

from celery import Celery
from kombu import Queue

QUEUE = os.environ["QBT_QUEUE"]

app = Celery("kombu_restore", broker=os.environ["QBT_BROKER"])
app.conf.task_default_queue = QUEUE
app.conf.broker_connection_retry_on_startup = True


@app.task(name="qbt.kombu_restore.add")
def add(a, b):
    return a + b


def send():
    print(add.apply_async((1, 2), queue=QUEUE).id, flush=True)


def take_and_restore():
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        message = Queue(QUEUE)(channel).get(no_ack=False)
        if message is None:
            sys.exit("nothing to take")
        print("taken", message.headers["id"], flush=True)
        sys.stdin.readline()
        channel.qos.restore_unacked()
        print("restored", flush=True)


if __name__ == "__main__":
    forms = {"send": send, "take-and-restore": take_and_restore}
    if len(sys.argv) != 2 or sys.argv[1] not in forms:
        sys.exit("usage: kombu_restore.py send|take-and-restore")
    forms[sys.argv[1]]()
