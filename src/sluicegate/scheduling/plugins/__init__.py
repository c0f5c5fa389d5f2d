"""Built-in plugins. Importing this package registers all of them."""

from sluicegate.scheduling.plugins import (  # noqa: F401
    active_request_scorer,
    kv_cache_utilization_scorer,
    least_request_picker,
    load_aware_scorer,
    lora_affinity_scorer,
    max_score_picker,
    prefix_cache,
    queue_scorer,
    random_picker,
    round_robin_picker,
    running_requests_scorer,
    session_affinity_scorer,
    single_profile_handler,
    token_load_scorer,
    weighted_random_picker,
)
