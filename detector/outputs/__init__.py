"""Outputs besides Slack: a signed webhook, Prometheus Alertmanager and email (docs/outputs.md).

:mod:`detector.outputs.config` holds what ``rules/routing.yaml`` says about them and is
imported by :mod:`detector.rules`, so this package imports nothing at load time.
"""
