"""Acting on an alert: stopping the instance, culling the notebook, scaling to zero.

See ``docs/actions.md``. :mod:`.base` holds what every executor shares.
"""
