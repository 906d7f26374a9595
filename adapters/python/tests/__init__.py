"""The adapters' own tests (``python -m unittest`` from adapters/python).

The team code the tests run (``celery_tasks``, ``rq_jobs``) is imported by
its own module name, as a worker or the runner's ``--app``/``--import``
imports it and as RQ records a job's function: this directory goes on
``sys.path`` first.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
