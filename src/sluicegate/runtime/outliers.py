"""Outlier detection on the event loop: the detector's settings from the configuration's
``outlierDetection`` (milliseconds to seconds) and the loop that ticks it.

The detector itself — which failures count, when an endpoint is ejected and for how long —
is :mod:`sluicegate.datalayer.outlier`.
"""

from __future__ import annotations

import asyncio
import logging

from sluicegate.api.settings import OutlierDetectionSettings
from sluicegate.datalayer.outlier import OutlierDetector, OutlierSettings

log = logging.getLogger("sluicegate.runtime")


async def tick(detector: OutlierDetector) -> None:
    """Tick ``detector`` every ``settings.tick_s`` seconds until cancelled."""
    while True:
        await asyncio.sleep(detector.settings.tick_s)
        try:
            detector.tick()
        except Exception:  # a bug must not end ejections (and returns) for good
            log.exception("outlier detection failed")


def outlier_settings(spec: OutlierDetectionSettings) -> OutlierSettings:
    """The detector's settings from the configuration's (ms to s)."""
    return OutlierSettings(
        consecutive_5xx=spec.consecutive_5xx,
        consecutive_gateway_failure=spec.consecutive_gateway_failure,
        interval_s=spec.interval_ms / 1000.0,
        base_ejection_s=spec.base_ejection_time_ms / 1000.0,
        max_ejection_s=spec.max_ejection_time_ms / 1000.0,
        max_ejection_percent=spec.max_ejection_percent,
        success_rate_minimum_hosts=spec.success_rate_minimum_hosts,
        success_rate_request_volume=spec.success_rate_request_volume,
        success_rate_stdev_factor=spec.success_rate_stdev_factor,
        failure_percentage_threshold=spec.failure_percentage_threshold,
        failure_percentage_minimum_hosts=spec.failure_percentage_minimum_hosts,
        failure_percentage_request_volume=spec.failure_percentage_request_volume,
        stall_timeout_s=spec.stall_timeout_ms / 1000.0,
    )


__all__ = ["outlier_settings", "tick"]
