"""burnwatch's detection core: events, detectors, rules, alerts and the store.

Nothing here imports Faust, so the streaming worker and ``burnwatch backtest``
run exactly the same code.
"""
