"""The cloud bill as a source of truth: FOCUS exports read into one normalized table (issue 15).

No Faust imports here; the stream side consumes what this package produces.
"""
