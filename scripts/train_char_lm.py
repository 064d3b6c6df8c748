"""Train the committed character model: `make checkpoints`.

Trains course_lib.tasks.char_lm's model with its TRAIN_SETTINGS (seeded; the
training loop runs on one torch thread, so the result is deterministic on
a given CPU and torch build), evaluates its validation bits per character
on the whole validation text, in float32 and after rounding the weights
to float16 as stored, and writes

- the checkpoint, course_lib/data/char_lm_pydoc.pt (config, float16
  weights, metadata: settings, steps, wall time, load average, threads,
  versions, validation bits/char);
- its line in benchmarks/results.md (section "Chapter 7: the character
  model checkpoint").

Options: --steps N overrides the number of steps (a quick check),
--out PATH writes the checkpoint elsewhere and leaves results.md alone.
"""
from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import torch

from course_lib.tasks import char_lm
from course_lib.tasks.text_corpus import CharVocab, load_pydoc_corpus

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.md"
SECTION = "## Chapter 7: the character model checkpoint (`make checkpoints`)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = dict(char_lm.TRAIN_SETTINGS)
    if args.steps is not None:
        settings["steps"] = args.steps
        settings["warmup_steps"] = min(settings["warmup_steps"], args.steps)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    model, history = char_lm.train_char_lm(**settings, progress=True)
    seconds = time.perf_counter() - start
    load_after = os.getloadavg()[0]

    corpus = load_pydoc_corpus()
    val_ids = CharVocab().encode(corpus.val)
    context = model.config.max_position_embeddings
    bpc32 = char_lm.bits_per_char(model, val_ids, context=context)
    info = dict(
        settings=settings, steps=settings["steps"],
        parameters=sum(p.numel() for p in model.parameters()),
        train_seconds=round(seconds, 1),
        load_average_start=round(load_before, 2),
        load_average_end=round(load_after, 2),
        threads=1,                       # training.train runs small_ops()
        torch_version=str(torch.__version__),
        python_version=corpus.python_version,
        train_chars=len(corpus.train), val_chars=len(corpus.val),
        final_train_loss=round(sum(history.loss[-50:]) /
                               len(history.loss[-50:]), 4),
        val_bits_per_char_float32=round(bpc32, 4),
        storage="float16 weights of a float32 model")
    out = args.out or char_lm.CHECKPOINT_PATH
    out.parent.mkdir(parents=True, exist_ok=True)
    char_lm.save_char_lm(out, model, info)
    loaded, _ = char_lm.load_char_lm(out)
    info["val_bits_per_char"] = round(
        char_lm.bits_per_char(loaded, val_ids, context=context), 4)
    char_lm.save_char_lm(out, model, info)
    print({k: v for k, v in info.items() if k != "settings"})
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    if args.out is None:
        write_results(info)


def write_results(info: dict) -> None:
    s = info["settings"]
    cfg = char_lm.MODEL_CONFIG
    body = (
        f"{SECTION}\n\n"
        f"`scripts/train_char_lm.py`, seed {s['seed']}, one torch thread, "
        f"Python {info['python_version']}, torch {info['torch_version']}. "
        f"Model: DecoderLM, {cfg['num_hidden_layers']} layers, d_model "
        f"{cfg['hidden_size']}, {cfg['num_attention_heads']} heads, context "
        f"{cfg['max_position_embeddings']}, dropout {cfg['dropout']}, "
        f"{info['parameters']:,} parameters, stored as float16. The wall "
        f"time depends on what else runs: compare the load average (2 "
        f"cores).\n\n"
        "| quantity | value |\n|---|---:|\n"
        f"| steps x batch x length | {s['steps']} x {s['batch_size']} x "
        f"{s['length']} |\n"
        f"| AdamW peak lr, warmup, schedule, weight decay | {s['lr']}, "
        f"{s['warmup_steps']}, cosine, {s['weight_decay']} |\n"
        f"| training wall time (s) | {info['train_seconds']} |\n"
        f"| load average at start / end | {info['load_average_start']} / "
        f"{info['load_average_end']} |\n"
        f"| training / validation characters | {info['train_chars']:,} / "
        f"{info['val_chars']:,} |\n"
        f"| final training loss (nats/char, mean of the last 50 "
        f"batches) | {info['final_train_loss']} |\n"
        f"| validation bits/char, float32 weights | "
        f"{info['val_bits_per_char_float32']} |\n"
        f"| validation bits/char, float16 weights as stored | "
        f"{info['val_bits_per_char']} |\n")
    text = RESULTS.read_text()
    pattern = re.compile(re.escape(SECTION) + r".*?(?=\n## |\Z)", re.S)
    if pattern.search(text):
        text = pattern.sub(body.rstrip("\n") + "\n", text)
    else:
        anchor = "## Chapter 9:"
        text = text.replace(anchor, body + "\n" + anchor, 1)
    RESULTS.write_text(text)
    print(f"updated {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
