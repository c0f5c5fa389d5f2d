"""The built-in flow-control policies (saturation detectors, usage limits, fairness and
ordering); :mod:`sluicegate.builtins` registers them.

This package exports nothing (``__all__`` is empty): it is a namespace of plugin modules.
Policies are reached by type name through the registry (``sluicegate.default_registry()``),
and a re-export here would load every policy with any one of them.
"""

__all__: list[str] = []
