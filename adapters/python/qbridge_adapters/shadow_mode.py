"""What a task does when qbridge calls it in shadow mode.

In ``shadow`` the Postgres side runs every job a second time for comparison
while the fleet still runs it for real, so a task must not repeat its side
effects. Each task declares one of:

- ``"refuse"`` (the default for a task that declares nothing): the runner
  does not call it and answers 422, so the diff shows a mismatch and the
  shadow gate refuses. For a route of tasks that cannot run twice, declare
  one of the others, or give it a no-op shadow handler
  (``shadow = { handler = { type = "noop" } }``).
- ``"skip"``: the runner does not call it and answers 204 (done, nothing to
  compare): the diff compares the outcome only.
- a callable (a *dry run*): called with the task's arguments instead of the
  task; it must not have side effects, and its return value is compared with
  the fleet's.

Declare it with ``@shadow(...)`` on a function (RQ), or as the task option
``qbridge_shadow=...`` (Celery: ``@app.task(qbridge_shadow="skip")``).
"""

REFUSE = "refuse"
SKIP = "skip"


def shadow(behaviour):
    """Decorator: ``@shadow("skip")``, ``@shadow(dry_run_function)``."""
    check(behaviour)

    def mark(fn):
        fn.qbridge_shadow = behaviour
        return fn

    return mark


def check(behaviour):
    if behaviour not in (REFUSE, SKIP) and not callable(behaviour):
        raise ValueError(f'qbridge_shadow must be "refuse", "skip" or a callable, not {behaviour!r}')
    return behaviour


def of(target):
    """The declared behaviour of a function or a task (default: refuse)."""
    behaviour = getattr(target, "qbridge_shadow", None) or REFUSE
    # A task option becomes a class attribute, so a dry run read from the
    # task comes back bound to it: call the function as declared.
    if getattr(behaviour, "__self__", None) is target:
        behaviour = behaviour.__func__
    return check(behaviour)


def run(target, name, how_to_declare, args, kwargs):
    """A shadow call of ``target`` (a task or a job function named ``name``):
    its declared behaviour, as the runner answers it (see ``answer``)."""
    from .answer import Outcome, done

    try:
        behaviour = of(target)
    except ValueError as error:
        raise Outcome(422, f"{name}: {error}") from None
    if behaviour == REFUSE:
        raise Outcome(422, f"{name} refuses shadow calls ({how_to_declare})")
    if behaviour == SKIP:
        raise Outcome(204, "")
    return done(behaviour(*args, **kwargs))
