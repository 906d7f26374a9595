"""A Celery 5 application moving to qbridge. Two lines are qbridge's (marked);
the task is the team's code, unchanged except its shadow declaration.

    fleet:   QBRIDGE_OUTCOMES=http://127.0.0.1:8080 QBRIDGE_ROUTE=reports \\
             PYTHONPATH=adapters/python:examples/fleets celery -A celery_app worker -Q reports
    runner:  PYTHONPATH=adapters/python:examples/fleets \\
             python -m qbridge_adapters.runner celery --app celery_app:app --listen 127.0.0.1:8092
    produce: REDIS_URL=redis://127.0.0.1:6380/0 PYTHONPATH=examples/fleets python examples/fleets/celery_app.py 10
             (or: produce N; schedule N SECONDS, a countdown each)

It is also the application `qbridge demo --framework celery` runs (the
binary embeds this file) and the one the integration tests drive, through
its environment:

    REDIS_URL         the broker (default redis://127.0.0.1:6379/0)
    QUEUE_NAME        the Celery queue (default reports)
    KEY_PREFIX        kombu's global_keyprefix (the route's key_prefix)
    PRIORITY_STEPS    kombu's priority_steps, e.g. 0,5,9 (the route's
                      priority_steps); tasks are then sent with priorities
    LEDGER_URL        where the task says it ran (the drill's ledger, its
                      stand-in for the upload); LEDGER_SIDE names the side
"""

import os
import sys
import urllib.error
import urllib.request

from celery import Celery

app = Celery("reports", broker=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.task_default_queue = os.environ.get("QUEUE_NAME", "reports")
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
_options = {}
if os.environ.get("KEY_PREFIX"):
    _options["global_keyprefix"] = os.environ["KEY_PREFIX"]
if os.environ.get("PRIORITY_STEPS"):
    _options["priority_steps"] = [int(s) for s in os.environ["PRIORITY_STEPS"].split(",")]
app.conf.broker_transport_options = _options

if os.environ.get("QBRIDGE_OUTCOMES"):
    from qbridge_adapters.celery import report_outcomes  # qbridge

    report_outcomes(app)  # qbridge: the fleet reports


class UploadFailed(ConnectionError):
    """The upload did not go through this time: Celery retries the task."""


def _summary(account_id):
    return {"account": account_id, "rows": 42}


def _upload(task_id, account_id):
    """The task's side effect. Here, without a ledger, nothing; with one
    (the drill), it tells the ledger the task ran, and every fifth task's
    first upload fails (the ledger answers 409) and is retried."""
    ledger = os.environ.get("LEDGER_URL")
    if not ledger:
        return
    headers = {"qbridge-job-key": task_id, "qbd-side": os.environ.get("LEDGER_SIDE", "redis")}
    tries = [dict(headers, **{"qbd-flaky": "1"}), headers] if account_id % 5 == 4 else [headers]
    for sent in tries:
        request = urllib.request.Request(ledger, data=b"", method="POST", headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as error:
            if error.code == 409:
                raise UploadFailed() from None
            raise


# In shadow, qbridge's runner calls the dry run: the same answer, no upload.
# A failed upload is retried after a second, up to five times.
@app.task(name="reports.monthly", bind=True, autoretry_for=(ConnectionError,), max_retries=5,
          default_retry_delay=1, qbridge_shadow=_summary)
def monthly(self, account_id):
    summary = _summary(account_id)
    _upload(self.request.id, account_id)
    return summary


def _send(i, **options):
    if os.environ.get("PRIORITY_STEPS"):
        options["priority"] = i % 10
    return monthly.apply_async((i,), **options).id


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["schedule"]:
        for i in range(int(args[1])):
            print(_send(i, countdown=float(args[2])), flush=True)
    elif args[:1] == ["produce"] or not args or args[0].isdigit():
        n = int(args[-1]) if args and args[-1].isdigit() else 10
        for i in range(n):
            print(_send(i), flush=True)
    else:
        sys.exit("usage: celery_app.py [produce] N | schedule N SECONDS")
