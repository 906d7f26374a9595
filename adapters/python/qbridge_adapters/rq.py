"""RQ: the fleet's outcome reporter (a worker class) and the Postgres
side's job runner.

Fleet side: run the workers with the reporting class, e.g.
``rq worker -w qbridge_adapters.rq.ReportingWorker`` (or
``ReportingSimpleWorker``), settings from QBRIDGE_* (see settings).
Outcomes, keyed by the RQ job id (qbridge's key for the ``rq`` format):
success → ok (detail: the return value, ``canonical``); a failure with
retries left (``Retry``) → failed; a final one → dead.

Postgres side: ``python -m qbridge_adapters.runner rq`` rebuilds each job
from the ``rq:job:<id>`` hash qbridge mirrored with it and runs it with
RQ's own ``Job.perform`` (see ``run_job``). RQ's default serializer is
pickle: the runner unpickles what the team's own producers wrote, exactly
as their RQ workers do, so it must only listen where qbridge can reach it.
"""

import base64
import logging
from urllib.parse import quote

from redis import Redis
from rq import Retry
from rq.job import Job
from rq.worker import SimpleWorker, Worker

from . import shadow_mode as shadows
from .answer import Outcome, done
from .live_guard import LiveGuard
from .reporter import Reporter, canonical
from .settings import Settings

log = logging.getLogger("qbridge_adapters")


def _url_of(connection):
    """The URL of the worker's own Redis (credentials and TLS included), the
    default place for outcomes that could not be delivered."""
    kwargs = connection.connection_pool.connection_kwargs
    scheme = "rediss" if connection.connection_pool.connection_class.__name__ == "SSLConnection" else "redis"
    user, password = kwargs.get("username"), kwargs.get("password")
    auth = ""
    if password:
        auth = "{}:{}@".format(quote(user or "", safe=""), quote(password, safe=""))
    host = kwargs.get("host", "127.0.0.1")
    return f"{scheme}://{auth}{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def _class_of(exc_string):
    """The exception's class name from RQ's traceback text (its last line,
    ``module.Class: message``), as the runner names it; never the message."""
    lines = [line for line in exc_string.strip().splitlines() if line.strip()]
    head = lines[-1].split(":", 1)[0].strip() if lines else ""
    return head.rsplit(".", 1)[-1] or "failed"


class _Reporting:
    """Mixin: skips a job Postgres owns (the live-key guard) and reports
    each job's outcome after RQ handled it."""

    _qbridge = None
    _guard = None

    def _reporter(self):
        if _Reporting._qbridge is None:
            _Reporting._qbridge = Reporter(Settings.from_env(redis_url=_url_of(self.connection)))
            _Reporting._guard = LiveGuard(_Reporting._qbridge.settings, _Reporting._qbridge)
        return _Reporting._qbridge

    def execute_job(self, job, queue):
        # Asked in the worker before the job runs (before a work horse is
        # forked): a job Postgres owns is canceled, not run.
        self._reporter()
        if _Reporting._guard.owned(job.id):
            _Reporting._guard.skip(job.id)
            try:
                job.cancel()
            except Exception as error:  # noqa: BLE001 - the job is not run either way
                log.warning("qbridge: could not mark a skipped RQ job canceled (%s)", type(error).__name__)
            return None
        return super().execute_job(job, queue)

    def work(self, *args, **kwargs):
        # Settings are read at start: a missing one stops the worker here,
        # with one line, not at its first job.
        self._reporter()
        return super().work(*args, **kwargs)

    def handle_job_success(self, job, *args, **kwargs):
        done = super().handle_job_success(job, *args, **kwargs)
        self._reporter().report(job.id, "ok", canonical(getattr(job, "_result", None)))
        return done

    def handle_job_failure(self, job, *args, **kwargs):
        # RQ retries while retries are left (``Job.should_retry`` says the
        # same from RQ 2.1 on; RQ 1.x and 2.0 have only ``retries_left``).
        final = not (job.retries_left and job.retries_left > 0)
        done = super().handle_job_failure(job, *args, **kwargs)
        self._reporter().report(job.id, "dead" if final else "failed", _class_of(kwargs.get("exc_string", "")))
        return done

    def handle_job_retry(self, job, queue, retry, *args, **kwargs):
        # A job that returned rq.Retry: final once its retries are spent.
        final = bool(job.number_of_retries and job.number_of_retries >= retry.max)
        done = super().handle_job_retry(job, queue, retry, *args, **kwargs)
        self._reporter().report(job.id, "dead" if final else "failed", "Retry")
        return done


class ReportingWorker(_Reporting, Worker):
    """RQ's forking worker that reports outcomes to qbridge.

    The success of a job is handled in the work horse (a child process), so
    each horse flushes its reports before it exits (one second at most; what
    is unsent then is recorded in the ran set)."""

    def perform_job(self, *args, **kwargs):
        try:
            return super().perform_job(*args, **kwargs)
        finally:
            if getattr(self, "_is_horse", False) and _Reporting._qbridge is not None:
                # The horse exits with os._exit: deliver now, or record.
                _Reporting._qbridge.flush(1.0)


class ReportingSimpleWorker(_Reporting, SimpleWorker):
    """RQ's in-process worker that reports outcomes to qbridge."""


def _hash_of(payload):
    """The ``rq:job:<id>`` hash as qbridge mirrored it, as bytes."""
    fields = payload.get("rq_job")
    if not isinstance(fields, dict) or "data" not in fields:
        raise Outcome(422, "the job carries no rq:job hash (was it mirrored from RQ's queue?)")
    raw = {}
    for field, value in fields.items():
        if isinstance(value, dict) and "base64" in value:
            raw[field.encode()] = base64.b64decode(value["base64"])
        else:
            raw[field.encode()] = str(value).encode()
    return raw


def run_job(connection, payload, mode, attempt, key):
    """Runs one qbridge job of the ``rq`` format: returns (status, body).

    The job is restored from its hash (function, args, kwargs, retries) and
    run by ``Job.perform`` (so ``get_current_job()`` works). A failure is
    retried by qbridge (503) while the job's ``Retry`` allows more attempts,
    else final (422); qbridge's route decides when the retry runs.
    """
    job = Job(id=payload.get("rq_job_id") or key, connection=connection or Redis())
    try:
        job.restore(_hash_of(payload))
        func = job.func
    except Outcome:
        raise
    except Exception as error:  # noqa: BLE001 - a hash that does not load
        raise Outcome(422, f"cannot load the RQ job: {type(error).__name__}") from None
    if mode == "shadow":
        return shadows.run(func, job.func_name, "declare @shadow", job.args, job.kwargs)
    # RQ's retries_left counts the retries left when the job was enqueued.
    retries = job.retries_left or 0
    try:
        result = job.perform()
    except Exception as error:  # noqa: BLE001 - the job's own failure
        status = 503 if attempt - 1 < retries else 422
        raise Outcome(status, type(error).__name__) from None
    if isinstance(result, Retry):
        # The job asked to be retried (RQ 2+): while its Retry allows.
        raise Outcome(503 if attempt - 1 < result.max else 422, "Retry")
    return done(result)
