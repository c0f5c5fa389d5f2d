"""The benchmark lab: workloads, simulated clusters, load runners, reports and plots."""
