"""The team's Celery code as the adapters' tests see it: an app whose tasks
cover every retry rule and shadow declaration the runner and the reporter
must honour (a copy of its own, not examples/fleets/celery_app.py: that
application shows one ordinary task, this one each corner case).

The broker is QBRIDGE_TEST_REDIS_URL's Redis (the reporter tests run a real
worker on it); the runner tests call tasks directly and never touch it.
"""

import os

from celery import Celery

app = Celery("celery_tasks", broker=os.environ.get("QBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379"))
app.conf.broker_connection_retry_on_startup = True

CALLS = []


class Flaky(Exception):
    pass


@app.task(name="t.add", bind=True, qbridge_shadow=lambda a, b: a + b)
def add(self, a, b):
    CALLS.append(("add", self.request.id, self.request.retries))
    return a + b


@app.task(name="t.retrying", bind=True, max_retries=2)
def retrying(self):
    raise self.retry(exc=Flaky(), countdown=1)


@app.task(name="t.auto", autoretry_for=(Flaky,), max_retries=1)
def auto():
    raise Flaky()


class Base(app.Task):
    """A team's own base class for its tasks."""


@app.task(name="t.custom_base", bind=True, base=Base, max_retries=1)
def custom_base(self):
    raise self.retry(exc=Flaky())


@app.task(name="t.ignored")
def ignored():
    from celery.exceptions import Ignore

    raise Ignore()


@app.task(name="t.broken")
def broken():
    raise ValueError("not retried by Celery")


@app.task(name="t.skip", qbridge_shadow="skip")
def skipped():
    CALLS.append(("skip",))


@app.task(name="t.plain")
def plain():
    CALLS.append(("plain",))
