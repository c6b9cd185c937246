"""The chassis inlet temperature from the BMC agent's endpoint, for the governor's target."""

from __future__ import annotations

import logging

from agent_bmc.schema import chassis_temperature
from host_runtime.common.http_client import HTTPClient, HTTPFailure

log = logging.getLogger(__name__)


class BmcInletSource:
    """Callable: the inlet in degrees C, or None when the agent is down, stale or has no inlet sensor."""

    def __init__(self, telemetry_url: str, timeout_s: float = 0.5):
        self.url = telemetry_url
        self.timeout_s = timeout_s
        self.last_problem: str | None = None
        self._http = HTTPClient()  # asked every tick: one kept connection

    def __call__(self) -> float | None:
        try:
            answer = self._http.get(self.url, timeout=self.timeout_s).raise_for_status()
            value = chassis_temperature(answer.json(), "inlet")
        except HTTPFailure as exc:
            self._problem(f"the BMC agent at {self.url} did not answer: {exc.why}")
            return None
        except ValueError as exc:
            self._problem(f"the BMC agent at {self.url} answered something that is not its telemetry: {exc}")
            return None
        if value is None:
            self._problem("the BMC agent has no fresh inlet reading")
        else:
            self.last_problem = None
        return value

    def _problem(self, text: str) -> None:
        if text != self.last_problem:  # say it once, not every tick
            log.warning("%s; holding the policy's own target", text)
        self.last_problem = text
