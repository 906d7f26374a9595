"""A Celery 5 application moving to qbridge. Two lines are qbridge's (marked);
the tasks are the team's code, unchanged except their shadow declaration.

    fleet:   QBRIDGE_OUTCOMES=http://127.0.0.1:8080 QBRIDGE_ROUTE=reports \\
             PYTHONPATH=adapters/python:examples/fleets celery -A celery_app worker -Q reports
    runner:  PYTHONPATH=adapters/python:examples/fleets \\
             python -m qbridge_adapters.runner celery --app celery_app:app --listen 127.0.0.1:8092
    produce: REDIS_URL=redis://127.0.0.1:6380/0 PYTHONPATH=examples/fleets python examples/fleets/celery_app.py 10
"""

import os
import sys

from celery import Celery

app = Celery("reports", broker=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.task_default_queue = "reports"

if os.environ.get("QBRIDGE_OUTCOMES"):
    from qbridge_adapters.celery import report_outcomes  # qbridge

    report_outcomes(app)  # qbridge: the fleet reports


def _summary(account_id):
    return {"account": account_id, "rows": 42}


# In shadow, qbridge's runner calls the dry run: the same answer, no upload.
@app.task(name="reports.monthly", autoretry_for=(ConnectionError,), max_retries=5,
          qbridge_shadow=_summary)
def monthly(account_id):
    summary = _summary(account_id)
    # upload the report here (the side effect)
    return summary


if __name__ == "__main__":
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
        print(monthly.delay(i).id)
