"""Scaling out (chapter 14): worker processes on one machine
(``launch``), Megatron's collectives, tensor- and expert-parallel layers,
node-limited routing, and the chapter's experiments as spawnable workers.
"""
