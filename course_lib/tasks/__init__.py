"""The data the chapters train on: a toy translation with a known
answer, a synthetic language with an exact entropy rate, real text (the
Python manual) with its character model, n-gram baselines, and the
special token ids they share.
"""
