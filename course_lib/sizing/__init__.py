"""Models by their numbers (chapters 9 and 12): the configuration
dataclass and the published configurations, parameter counts (total and
active), the bytes of a KV cache, and a small course model built from a
configuration.
"""
