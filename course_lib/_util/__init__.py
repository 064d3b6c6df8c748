"""Private helpers: argument checks (``validation``), best-of-n timing
(``timing``) and the one-thread context for small tensor ops
(``threads``).
"""
