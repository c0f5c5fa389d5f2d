"""Built-in flow-control plugins. Importing this package registers all of them."""

from sluicegate.flowcontrol.policies import (  # noqa: F401
    fairness,
    ordering,
    saturation,
    usage_limit,
)
