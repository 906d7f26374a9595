"""qbridge's fleet adapters for Python job frameworks (Celery, RQ).

Two ends of a migration from Redis to qbridge's Postgres queue, with no
change to task code:

- **Reporters** (``qbridge_adapters.celery.report_outcomes``,
  ``qbridge_adapters.rq.ReportingWorker``) tell qbridge what the team's
  existing fleet did with each job, so ``qbridge diff`` can compare the two
  sides and never mistakes a job the fleet ran for a lost one.
- **Runners** (``python -m qbridge_adapters.runner``) run the same task code
  as qbridge's handler on the Postgres side, in shadow and then live.

Configuration is read from the environment (see ``settings``).
"""

from .reporter import Reporter, canonical
from .settings import Settings
from .shadow_mode import shadow

__all__ = ["Reporter", "Settings", "canonical", "shadow"]
