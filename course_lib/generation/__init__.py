"""From a model's logits to text (chapters 8 and 9): the logit filters
and sampling, penalties against repetition, beam search, and cached
generation.
"""
