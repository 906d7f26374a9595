"""The team's code, as the runner tests see it: a Celery app and RQ job
functions with every shadow declaration."""

from celery import Celery

from qbridge_adapters import shadow

app = Celery("tasks", broker="memory://")
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


@shadow(lambda n: {"n": n})
def rq_job(n):
    from rq import get_current_job

    CALLS.append(("rq", get_current_job().id))
    return {"n": n}


def rq_failing():
    raise Flaky()
