"""The special token ids shared by the course's synthetic tasks.

The toy translation (chapter 7) numbers its special tokens the same way in
both vocabularies; a target no loss counts is
:data:`course_lib.training.IGNORE`.
A real model brings its own special tokens (chapter 13 reads them from the
model file).
"""

__all__ = ["PAD", "BOS", "EOS", "SPECIALS"]

PAD, BOS, EOS = 0, 1, 2          # padding, begin and end of sequence
SPECIALS = ["<pad>", "<bos>", "<eos>"]  # their strings, in id order
