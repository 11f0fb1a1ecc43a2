"""The anomaly model: feature windows (``features``) and the isolation forest (``forest``)."""
