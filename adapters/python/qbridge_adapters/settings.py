"""The adapters' settings, one environment variable each.

QBRIDGE_OUTCOMES   where outcomes go: qbridge's HTTP listener
                   (``http://host:port``, ``/v1/outcomes`` is added) or its
                   database (``postgres://…``, needs psycopg 3)
QBRIDGE_TOKEN      the report token, when the listener has one
QBRIDGE_ROUTE      the route's name (its ``qbridge:ran:<route>`` set records
                   jobs whose outcome could not be delivered)
QBRIDGE_QUEUE      the route's Postgres queue (default: the route's name)
QBRIDGE_REDIS_URL  the Redis of the route (default: the framework's broker)
"""

import os
from dataclasses import dataclass
from typing import Optional


class SettingsError(ValueError):
    """A setting is missing or malformed (one line, names the variable)."""


@dataclass(frozen=True)
class Settings:
    outcomes: str
    route: str
    queue: str
    token: Optional[str] = None
    redis_url: Optional[str] = None

    @staticmethod
    def from_env(redis_url: Optional[str] = None, env=None) -> "Settings":
        env = os.environ if env is None else env
        outcomes = env.get("QBRIDGE_OUTCOMES", "").strip()
        route = env.get("QBRIDGE_ROUTE", "").strip()
        if not outcomes:
            raise SettingsError("QBRIDGE_OUTCOMES is not set: give qbridge's HTTP listener (http://host:port) or its database (postgres://...)")
        if not outcomes.startswith(("http://", "https://", "postgres://", "postgresql://")):
            raise SettingsError("QBRIDGE_OUTCOMES must start with http://, https://, postgres:// or postgresql://")
        if not route:
            raise SettingsError("QBRIDGE_ROUTE is not set: give the name of the route in qbridge.toml")
        return Settings(
            outcomes=outcomes,
            route=route,
            queue=env.get("QBRIDGE_QUEUE", "").strip() or route,
            token=env.get("QBRIDGE_TOKEN") or None,
            redis_url=env.get("QBRIDGE_REDIS_URL") or redis_url,
        )

    @property
    def over_sql(self) -> bool:
        return self.outcomes.startswith(("postgres://", "postgresql://"))

    @property
    def outcomes_url(self) -> str:
        """The HTTP endpoint (``/v1/outcomes`` added to a bare host)."""
        base = self.outcomes.rstrip("/")
        return base if base.endswith("/v1/outcomes") else base + "/v1/outcomes"

    @property
    def live_key(self) -> str:
        """The route's live-key guard: the job keys Postgres holds live."""
        return f"qbridge:live:{self.route}"

    @property
    def ran_key(self) -> str:
        """The route's ran set (the same key qbridge's own consumer writes)."""
        return f"qbridge:ran:{self.route}"
