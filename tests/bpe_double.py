"""A GPT-2-style byte-level BPE tokenizer built locally: the test double for GPT-2's tokenizer.

GPT-2's own vocabulary cannot be downloaded here. This double has what the task code must handle
in GPT-2: byte-level BPE with the leading space inside word tokens ("ĠJohn") and two-digit number
tokens ("Ġ17" + "32" for " 1732"), so the greater-than two-digit path is exercised. Numbers are split
into pairs of digits before BPE, as GPT-2's merges effectively do for most years.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from lit_svd.datamodules import task_words as words

SPECIAL = "<|endoftext|>"


def _corpus(wikitext: str | None) -> list[str]:
    """Training text: the task words in context (so names become single tokens), every two-digit
    number, and some real English when available."""
    names = words.MALE_NAMES + words.FEMALE_NAMES
    lines = [
        f"When {a} and {b} went to the {p}, {b} gave {o} to {a}."
        for (a, b), p, o in zip(
            itertools.permutations(names[:40], 2), itertools.cycle(words.PLACES), itertools.cycle(words.OBJECTS)
        )
    ]
    lines += [f"So {n} is a very {adj} person, isn't he or she?" for n in names for adj in words.GP_ADJECTIVES[:5]]
    lines += [
        tpl.format(noun=noun, century=c, start=f"{x:02d}") + f"{(x + 7) % 100:02d}."
        for tpl in words.GT_TEMPLATES
        for noun in words.GT_NOUNS[:4]
        for c in words.GT_CENTURIES
        for x in range(100)
    ]
    lines += [" ".join(words.IOI_TEMPLATES + words.GP_TEMPLATES)] * 20
    if wikitext:
        lines += Path(wikitext).read_text(encoding="utf-8").splitlines()[:3000]
    return lines


@functools.lru_cache(maxsize=4)
def gpt2_style_tokenizer(vocab_size: int = 6000, wikitext: str | None = None):
    """A ``PreTrainedTokenizerFast`` trained in a few seconds; cached per process."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r" ?\d\d|\d"), behavior="isolated"),  # " 1732" -> " 17", "32"
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(wikitext), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL, pad_token=SPECIAL)


def save_gpt2_style_tokenizer(folder: str, vocab_size: int = 6000) -> str:
    """Save the double as an HF tokenizer folder (loadable by ``load_tokenizer(folder)``)."""
    gpt2_style_tokenizer(vocab_size).save_pretrained(folder)
    return folder
