"""A real model (chapter 13): SmolLM2-135M read from its GGUF file
(``gguf_file``), its byte-level BPE tokenizer (``tokenizer``; ``bpe`` is a
short pure-Python version for reading), and its weights loaded into the
course's ``DecoderLM`` by renaming (``smollm2``).
"""
