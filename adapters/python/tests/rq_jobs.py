"""The team's RQ code as the adapters' tests see it: job functions covering
the runner's retry rules and shadow declarations and the reporter's
outcomes (a copy of its own, not examples/fleets/rq_app.py: that
application shows one ordinary job, this one each corner case). RQ records
a job's function by module name: this module is ``rq_jobs``."""

from qbridge_adapters import shadow

CALLS = []


class Flaky(Exception):
    pass


@shadow(lambda n: {"n": n})
def rq_job(n):
    from rq import get_current_job

    CALLS.append(("rq", get_current_job().id))
    return {"n": n}


def rq_failing():
    raise Flaky()


def rq_ok(n):
    return {"n": n}


def rq_asks_retry():
    """Asks RQ to run it again (a returned ``Retry``, RQ 2 and later)."""
    from rq import Retry

    return Retry(max=1)
