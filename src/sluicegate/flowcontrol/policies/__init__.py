"""The built-in flow-control policies (saturation detectors, usage limits, fairness and
ordering); :mod:`sluicegate.builtins` registers them."""
