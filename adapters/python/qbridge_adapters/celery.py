"""Celery (5.x, kombu's Redis transport): the fleet's outcome reporter and
the Postgres side's task runner.

Fleet side, in the module that creates the app::

    from qbridge_adapters.celery import report_outcomes
    report_outcomes(app)          # settings from QBRIDGE_* (see settings)

Outcomes, keyed by the task id (qbridge's key for the ``celery`` format):
``task_success`` → ok (detail: the return value, ``canonical``),
``task_retry`` → failed (Celery runs it again), ``task_failure`` → dead
(Celery's failure is final: no retry is left or none was asked for),
``task_revoked`` → dead. A task whose id Postgres holds live (the live-key
guard, asked on ``task_received``) is revoked before it runs and reported
as skipped.

Postgres side: ``python -m qbridge_adapters.runner celery --app pkg.mod:app``
runs each job's task by name with its args and kwargs (see ``run_job``).
"""

import threading

from celery import signals
from celery.app.task import Task
from celery.exceptions import Ignore, Retry
from celery.worker import state as worker_state

from . import shadow_mode as shadows
from .answer import Outcome, done
from .live_guard import LiveGuard
from .reporter import Reporter, canonical
from .settings import Settings, SettingsError

_installed = []


def report_outcomes(app, reporter=None):
    """Connects the reporter to ``app``'s task signals.

    Call it where the app is created. Only a Celery worker of ``app``
    reports: its settings (``QBRIDGE_OUTCOMES``, ``QBRIDGE_ROUTE``, see
    ``settings``) are read when the worker starts (``worker_init``), not at
    import, so the producers and qbridge's task runner, which import the
    same module, need none and report nothing (the runner's outcomes are
    the Postgres side's, recorded by qbridge itself). A worker started
    without them stops at once with the one-line reason: a fleet that
    silently reported nothing would hold the gates shut with no cause shown.
    ``reporter``: one made already (tests); it reports from the start.
    """
    state = {"reporter": reporter, "guard": None, "skipping": set()}
    if reporter is not None:
        _installed.append(reporter)
        state["guard"] = LiveGuard(reporter.settings, reporter)

    def start(sender=None, **_):
        if getattr(sender, "app", app) is not app or state["reporter"] is not None:
            return
        try:
            made = Reporter(Settings.from_env(redis_url=app.conf.broker_url))
        except SettingsError as e:
            # SystemExit, not an exception: Celery logs and swallows those
            # a signal handler raises, and the worker would run unreported.
            raise SystemExit(f"qbridge reporter: {e}") from None
        state["reporter"] = made
        state["guard"] = LiveGuard(made.settings, made)
        _installed.append(made)

    def report(key, outcome, detail):
        if state["reporter"] is not None:
            state["reporter"].report(key, outcome, detail)

    def ok(sender=None, result=None, **_):
        report(sender.request.id, "ok", canonical(result))

    def retried(request=None, reason=None, **_):
        report(getattr(request, "id", None), "failed", type(reason).__name__)

    def failed(task_id=None, exception=None, **_):
        report(task_id, "dead", type(exception).__name__)

    def received(request=None, **_):
        # In the worker's consumer, before the task goes to the pool: a task
        # Postgres owns is revoked (Celery acknowledges it and does not run
        # it), and reported as skipped when the revoke is announced.
        guard, task_id = state["guard"], getattr(request, "id", None)
        if guard is not None and task_id and guard.owned(task_id):
            state["skipping"].add(task_id)
            worker_state.revoked.add(task_id)

    def revoked(request=None, **_):
        task_id = getattr(request, "id", None)
        if task_id in state["skipping"]:
            state["skipping"].discard(task_id)
            if state["guard"] is not None:
                state["guard"].skip(task_id)
            return
        report(task_id, "dead", "revoked")

    def close(**_):
        if state["reporter"] is not None:
            state["reporter"].close()

    def flush(**_):
        if state["reporter"] is not None:
            state["reporter"].flush()

    # weak=False: the handlers are closures that would be collected at once.
    signals.worker_init.connect(start, weak=False)
    signals.task_success.connect(ok, weak=False)
    signals.task_retry.connect(retried, weak=False)
    signals.task_failure.connect(failed, weak=False)
    signals.task_received.connect(received, weak=False)
    signals.task_revoked.connect(revoked, weak=False)
    signals.worker_shutdown.connect(close, weak=False)
    # A prefork child exits with os._exit: it flushes (or records) first.
    signals.worker_process_shutdown.connect(flush, weak=False)
    return reporter


_asked = threading.local()


def _watch_retries():
    """Notes when a task calls ``self.retry()``: called directly (as the
    runner calls it) Celery raises the task's exception from ``retry``, and
    the runner must still tell a retry from a failure. Patched on Celery's
    base ``Task``, so tasks with a custom base class are seen too."""
    if getattr(Task.retry, "_qbridge_watched", False):
        return
    original = Task.retry

    def retry(self, *args, **kwargs):
        _asked.max_retries = kwargs.get("max_retries") or self.max_retries
        _asked.retry = True
        return original(self, *args, **kwargs)

    retry._qbridge_watched = True
    Task.retry = retry


def run_job(app, payload, mode, attempt, key):
    """Runs one qbridge job of the ``celery`` format: returns (status, body).

    The task is found by name (``headers.task``) in ``app``'s registry and
    called directly with the message's args and kwargs, its request id the
    Celery task id, ``request.retries`` the attempts before this one. A
    failure is retried by qbridge (503) when Celery would retry it — the
    task called ``self.retry()`` or raised one of its ``autoretry_for`` — and
    its ``max_retries`` is not spent; otherwise it is final (422). qbridge's
    route decides when the retry runs (its backoff), not the task's
    countdown.
    """
    _watch_retries()
    envelope = payload.get("envelope") or {}
    headers = envelope.get("headers") or {}
    name = headers.get("task")
    task_id = headers.get("id") or key
    body = payload.get("body")
    if not name or name not in app.tasks:
        raise Outcome(422, f"unknown task {name!r}")
    if not isinstance(body, list) or len(body) < 2:
        raise Outcome(422, "the message body is not Celery's JSON [args, kwargs, embed] (use the json serializer)")
    args, kwargs = body[0], body[1]
    task = app.tasks[name]
    if mode == "shadow":
        return shadows.run(task, f"task {name}", "declare qbridge_shadow", args, kwargs)
    _asked.retry = False
    task.push_request(id=task_id, args=args, kwargs=kwargs, retries=max(attempt - 1, 0), delivery_info={})
    try:
        result = task.run(*args, **kwargs)
    except Ignore:
        # Celery acknowledges an ignored task: done, with no result.
        raise Outcome(204, "") from None
    except Exception as error:  # noqa: BLE001 - the task's own failure
        asked = getattr(_asked, "retry", False) or isinstance(error, Retry)
        autoretry = tuple(getattr(task, "autoretry_for", ()) or ())
        never = tuple(getattr(task, "dont_autoretry_for", ()) or ())
        limit = getattr(_asked, "max_retries", task.max_retries) if asked else task.max_retries
        retryable = asked or (autoretry and isinstance(error, autoretry) and not isinstance(error, never))
        if retryable and (limit is None or attempt - 1 < limit):
            raise Outcome(503, type(error).__name__) from None
        # As the fleet's task_failure names it: a retry() without an
        # exception that ran out of retries is MaxRetriesExceededError.
        name = "MaxRetriesExceededError" if isinstance(error, Retry) else type(error).__name__
        raise Outcome(422, name) from None
    finally:
        task.pop_request()
    return done(result)

