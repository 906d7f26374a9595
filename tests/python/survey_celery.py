"""The Celery application of `qbridge survey`'s tests, on the Redis at
QBT_BROKER, under kombu's `global_keyprefix` QBT_PREFIX when it is set.
Every task's arguments carry QBT_MARK (the tests assert it never reaches the
survey's output).

- `python survey_celery.py later`: one task with a countdown of an hour (a
  worker takes it at once and holds it in `unacked` until then);
- `python survey_celery.py produce`: two tasks without a priority, one with
  priority 5 (kombu's list for step 3) and one with priority 9 (step 9);
- `celery -A survey_celery worker -Q orders`: the worker.
"""

import os
import sys

from celery import Celery

app = Celery("survey_celery", broker=os.environ["QBT_BROKER"])
app.conf.task_default_queue = "orders"
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
if os.environ.get("QBT_PREFIX"):
    app.conf.broker_transport_options = {"global_keyprefix": os.environ["QBT_PREFIX"]}

MARK = os.environ.get("QBT_MARK", "")


@app.task(name="survey.echo")
def echo(mark, n):
    return n


if __name__ == "__main__" and sys.argv[1:2] == ["later"]:
    echo.apply_async((MARK, 0), countdown=3600)
elif __name__ == "__main__" and sys.argv[1:2] == ["produce"]:
    echo.delay(MARK, 1)
    echo.delay(MARK, 2)
    echo.apply_async((MARK, 3), priority=5)
    echo.apply_async((MARK, 4), priority=9)
elif __name__ == "__main__":
    sys.exit("usage: survey_celery.py later | produce")
