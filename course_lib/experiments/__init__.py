"""What the chapters measure and probe, apart from the model: the RNN
and the recall task (chapter 1), positional probes (2), the cost of the
attention weights and why scores are scaled (3), mask probes (4), heads
read as circuits and roles (5), residuals, norms and init in deep
stacks (6), attention maps of a real model (13).
"""
