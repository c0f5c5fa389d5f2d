"""Built-in plugins. Importing this package registers all of them."""

from sluicegate.scheduling.plugins import (  # noqa: F401
    active_request_scorer,
    kv_cache_utilization_scorer,
    latency_scorer,
    latency_slo_admitter,
    least_request_picker,
    load_aware_scorer,
    lora_affinity_scorer,
    max_score_picker,
    predicted_latency,
    prefix_affinity_filter,
    prefix_cache,
    queue_scorer,
    random_picker,
    round_robin_picker,
    running_requests_scorer,
    session_affinity_scorer,
    single_profile_handler,
    slo_headroom_tier_filter,
    token_load_scorer,
    weighted_random_picker,
)
