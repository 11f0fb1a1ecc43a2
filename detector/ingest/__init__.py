"""Ingest: what GPU fleets already expose (Prometheus text from dcgm-exporter and
kube-state-metrics) mapped onto burnwatch's event contract.

Pure functions and small stateful mappers, no I/O: ``streams/bridge.py`` scrapes
and publishes, this package decides what the samples mean (docs/ingest.md).
"""
