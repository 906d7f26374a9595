"""How a runner answers qbridge for one job (the http handler's contract):
2xx done (its body is the response the diff compares; 204: nothing to
compare), 503 retry later, 422 failed for good (dead)."""

from .reporter import canonical


class Outcome(Exception):
    """A job's end other than a plain 200: ``status`` and a short body (an
    exception's class name, never its message: it may quote the payload)."""

    def __init__(self, status, body):
        super().__init__(body)
        self.status = status
        self.body = body


def done(result):
    """A finished job's answer: its canonical result, or 204 when the result
    cannot be written as JSON (nothing to compare, as on the fleet's side)."""
    text = canonical(result)
    if text is None:
        raise Outcome(204, "")
    return 200, text
