"""Task prompts: indirect object identification (IOI), gender pronoun (GP) and greater-than (GT).

``TaskDataModule(task="ioi" | "gp" | "gt", tokenizer="smollm2-135m", n_train, n_val, n_test, seed)``
builds seeded, disjoint train / validation / test splits of clean prompts, matched corrupted prompts
and the answer tokens that define each task's metric (``lit_svd.metrics``).

Batch format (a dict of tensors; B examples, T = longest prompt in the batch):

=================  ==========  =============================================================
key                shape       meaning
=================  ==========  =============================================================
``clean_ids``      [B, T] long clean prompt, RIGHT-padded with the tokenizer's pad id
``corrupt_ids``    [B, T] long corrupted prompt; same token length as the clean one, so position
                               ``t`` of both is the same slot (they are patched position by position)
``attention_mask`` [B, T] long 1 on prompt tokens, 0 on padding; shared by clean and corrupt
``answer_pos``     [B] long    index of the last prompt token (where the answer is predicted)
``index``          [B] long    the example's index within its split (for sharding checks)
``correct_id``     [B] long    IOI: the indirect object's name; GP: the clean name's pronoun
``wrong_id``       [B] long    IOI: the subject's name; GP: the other pronoun
``greater_mask``   [B, V] bool GT only: next tokens that make the end year > the start year
``lesser_mask``    [B, V] bool GT only: next tokens that make the end year <= the start year
``start_year``     [B] long    GT only: the start year's last two digits (XX)
=================  ==========  =============================================================

V is ``len(tokenizer)``. Right padding keeps position ids right for every architecture; read the
answer logits with ``logits[arange(B), answer_pos]`` (``lit_svd.metrics.answer_logits``).

Tasks (templates and word lists in ``task_words``; names, pronouns and answers are filtered to those
that are ONE token with the leading space in the tokenizer in use):

* IOI: "When A and B went to the PLACE, B gave an OBJECT to" -> A (correct) vs B (wrong), in both
  orders (ABBA: IO first; BABA: subject first). Corrupted: ABC, the three name slots filled with
  three fresh names, distinct from A and B.
* GP: "So NAME is a very ADJ person, isn't" -> " he" / " she". Corrupted: a name of the other gender.
* GT: "The NOUN lasted from the year CCXX to the year CC" -> an end year above XX. Corrupted: XX = 01.
  With two-digit number tokens (GPT-2) the answer is the next token "YY": greater = {YY > XX},
  lesser = {YY <= XX}. With single-digit tokens (SmolLM2) the answer is the next digit d, the tens
  digit of the end year: d is *greater* when every year d0..d9 is above XX (d > XX // 10), *lesser*
  when every year d0..d9 is at or below XX (d < XX // 10, or d == XX // 10 when XX ends in 9), and
  in neither set otherwise (the tens digit of XX, whose years straddle XX).

Splits: each task's examples are points of a finite slot space (template x order x names x ...);
distinct points are drawn with ``random.Random(seed)``, test first, then validation, then train, so
the test set does not change when ``n_train`` does. With ``test_last=True`` the order is validation,
train, test: validation and train are then those of the same seed without a test split, so a recipe
tuned on that validation split gets a test split it has never seen. A size beyond the space fails at
construction.

Training order: the training loader shuffles with ``order_seed`` (the *training seed*; default: the split
``seed``, which is what every run before the option used). A second ``order_seed`` keeps all three
splits and changes only the order in which the training prompts are batched; nothing else in the mask
learner is random (lambda starts at a constant), so this is the one principled training seed.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lit_svd.data_options import canonical_task, check_task_data_options
from lit_svd.datamodules import task_words as words
from lit_svd.datamodules.common import ResumableTrainOrder, ShardSampler, rank_and_world, resolve_tokenizer


@dataclass(frozen=True)
class Prompt:
    """One example before tokenization. Answers are strings with their leading space (" Mary")."""

    clean: str
    corrupt: str
    correct: str | None = None
    wrong: str | None = None
    start_year: int | None = None  # GT: XX of the start year
    century: int | None = None  # GT: CC


@dataclass
class Encoded:
    """One tokenized example (lists, not tensors: collated per batch)."""

    clean_ids: list[int]
    corrupt_ids: list[int]
    index: int
    correct_id: int | None = None
    wrong_id: int | None = None
    start_year: int | None = None
    greater_ids: list[int] = field(default_factory=list)
    lesser_ids: list[int] = field(default_factory=list)


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def single_token_id(tokenizer, word: str) -> int | None:
    """The id of ``word`` when it is exactly one token, else None."""
    ids = encode(tokenizer, word)
    return ids[0] if len(ids) == 1 else None


def single_token_words(tokenizer, candidates: Sequence[str], prefix: str = " ") -> list[str]:
    """The candidates that are one token with ``prefix`` (the leading space) in ``tokenizer``."""
    return [w for w in candidates if single_token_id(tokenizer, prefix + w) is not None]


class PromptTask(ABC):
    """A task as a finite space of slot combinations; ``prompt(point, rng)`` renders one of them."""

    name: str = ""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @property
    @abstractmethod
    def radices(self) -> tuple[int, ...]:
        """Size of each slot; the space is their product."""

    @property
    def space_size(self) -> int:
        return math.prod(self.radices)

    def slots(self, point: int) -> tuple[int, ...]:
        """Mixed-radix decoding of a point of the space into slot indices."""
        out = []
        for radix in reversed(self.radices):
            point, digit = divmod(point, radix)
            out.append(digit)
        return tuple(reversed(out))

    @abstractmethod
    def prompt(self, point: int, rng: random.Random) -> Prompt:
        """The example at ``point``; ``rng`` draws the parts that are not slots (fresh names)."""

    def encode(self, prompt: Prompt, index: int, bos: list[int]) -> Encoded:
        tok = self.tokenizer
        clean, corrupt = bos + encode(tok, prompt.clean), bos + encode(tok, prompt.corrupt)
        if len(clean) != len(corrupt):
            raise ValueError(
                f"task {self.name}: clean and corrupted prompts differ in token length"
                f" ({len(clean)} vs {len(corrupt)}): {prompt.clean!r} / {prompt.corrupt!r}"
            )
        enc = Encoded(clean, corrupt, index)
        if prompt.correct is not None:
            enc.correct_id = single_token_id(tok, prompt.correct)
            enc.wrong_id = single_token_id(tok, prompt.wrong)
        return enc


def _require(count: int, needed: int, what: str, task: str) -> None:
    if count < needed:
        raise ValueError(
            f"task {task}: only {count} {what} are single tokens in this tokenizer; at least {needed} are needed"
        )


class IOITask(PromptTask):
    name = "ioi"
    templates = words.IOI_TEMPLATES

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.names = single_token_words(tokenizer, words.MALE_NAMES + words.FEMALE_NAMES)
        _require(len(self.names), 5, "names", self.name)  # IO, S and three fresh ABC names

    @property
    def radices(self):
        n = len(self.names)
        return (len(self.templates), 2, n, n - 1, len(words.PLACES), len(words.OBJECTS))

    def prompt(self, point, rng):
        template, order, io, s, place, obj = self.slots(point)
        s += s >= io  # the subject is any name but the IO
        io_name, s_name = self.names[io], self.names[s]
        fill = dict(place=words.PLACES[place], object=words.OBJECTS[obj])
        first, second = (io_name, s_name) if order == 0 else (s_name, io_name)  # ABBA / BABA
        fresh = rng.sample([n for n in self.names if n not in (io_name, s_name)], 3)
        tpl = self.templates[template]
        return Prompt(
            clean=tpl.format(n1=first, n2=second, s=s_name, **fill),
            corrupt=tpl.format(n1=fresh[0], n2=fresh[1], s=fresh[2], **fill),
            correct=" " + io_name,
            wrong=" " + s_name,
        )


class GenderPronounTask(PromptTask):
    name = "gp"
    templates = words.GP_TEMPLATES

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.by_gender = {
            g: single_token_words(tokenizer, names)
            for g, names in (("male", words.MALE_NAMES), ("female", words.FEMALE_NAMES))
        }
        for gender, names in self.by_gender.items():
            _require(len(names), 1, f"{gender} names", self.name)
        for pronoun in words.PRONOUNS.values():
            if single_token_id(tokenizer, " " + pronoun) is None:
                raise ValueError(f"task gp: the pronoun {pronoun!r} is not a single token in this tokenizer")
        self.names = [(n, g) for g in ("male", "female") for n in self.by_gender[g]]

    @property
    def radices(self):
        return (len(self.templates), len(self.names), len(words.GP_ADJECTIVES))

    def prompt(self, point, rng):
        template, name, adj = self.slots(point)
        clean_name, gender = self.names[name]
        other = "female" if gender == "male" else "male"
        tpl, adj_word = self.templates[template], words.GP_ADJECTIVES[adj]
        return Prompt(
            clean=tpl.format(name=clean_name, adj=adj_word),
            corrupt=tpl.format(name=rng.choice(self.by_gender[other]), adj=adj_word),
            correct=" " + words.PRONOUNS[gender],
            wrong=" " + words.PRONOUNS[other],
        )


class GreaterThanTask(PromptTask):
    """Greater-than with either two-digit number tokens or single digits (see the module docstring)."""

    name = "gt"
    templates = words.GT_TEMPLATES

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.mode, self.answer_ids = self._answer_tokens()
        # start years whose clean prompt has the corrupted prompt's token length, per century
        self.pairs = [
            (c, xx)
            for c in words.GT_CENTURIES
            for xx in words.GT_START_YEARS
            if self.answer_ids[c] and self._same_length(c, xx)
        ]
        _require(len(self.pairs), 1, "(century, start year) pairs", self.name)

    def _probe(self, century: int, start: int) -> tuple[str, str]:
        tpl = self.templates[0]
        return (
            tpl.format(noun="war", century=century, start=f"{start:02d}"),
            tpl.format(noun="war", century=century, start=f"{words.GT_CORRUPT_START:02d}"),
        )

    def _same_length(self, century: int, start: int) -> bool:
        clean, corrupt = self._probe(century, start)
        return len(encode(self.tokenizer, clean)) == len(encode(self.tokenizer, corrupt))

    def _continuations(self, century: int, width: int) -> dict[int, int]:
        """Answer value -> token id, for the values whose text is exactly one more token after the
        prompt (so the model's next-token distribution covers it)."""
        prompt = self._probe(century, 50)[0]
        base = encode(self.tokenizer, prompt)
        out = {}
        for value in range(10**width):
            ids = encode(self.tokenizer, prompt + f"{value:0{width}d}")
            if len(ids) == len(base) + 1 and ids[:-1] == base:
                out[value] = ids[-1]
        return out

    def _answer_tokens(self) -> tuple[str, dict[int, dict[int, int]]]:
        two = {c: self._continuations(c, 2) for c in words.GT_CENTURIES}
        if sum(len(v) for v in two.values()) >= 50 * len(two):  # most two-digit years are one token
            return "two_digit", two
        one = {c: self._continuations(c, 1) for c in words.GT_CENTURIES}
        if all(len(v) == 10 for v in one.values()):
            return "single_digit", one
        raise ValueError(
            "task gt: this tokenizer has neither two-digit year tokens nor single-digit tokens"
            " after the century; greater-than cannot be scored"
        )

    @property
    def radices(self):
        return (len(self.templates), len(words.GT_NOUNS), len(self.pairs))

    def prompt(self, point, rng):
        template, noun, pair = self.slots(point)
        century, start = self.pairs[pair]
        tpl, fill = self.templates[template], dict(noun=words.GT_NOUNS[noun], century=century)
        return Prompt(
            clean=tpl.format(start=f"{start:02d}", **fill),
            corrupt=tpl.format(start=f"{words.GT_CORRUPT_START:02d}", **fill),
            start_year=start,
            century=century,
        )

    def answer_sets(self, century: int, start: int) -> tuple[list[int], list[int]]:
        """Token ids of the greater and the at-or-below answers after ``century`` given start ``XX``."""
        greater, lesser = [], []
        for value, token in self.answer_ids[century].items():
            low, high = (value, value) if self.mode == "two_digit" else (10 * value, 10 * value + 9)
            if low > start:
                greater.append(token)
            elif high <= start:
                lesser.append(token)
        return greater, lesser

    def encode(self, prompt, index, bos):
        enc = super().encode(prompt, index, bos)
        enc.start_year = prompt.start_year
        enc.greater_ids, enc.lesser_ids = self.answer_sets(prompt.century, prompt.start_year)
        return enc


TASKS: dict[str, type[PromptTask]] = {"ioi": IOITask, "gp": GenderPronounTask, "gt": GreaterThanTask}


def make_task(task: str, tokenizer) -> PromptTask:
    return TASKS[canonical_task(task)](tokenizer)


def draw_points(space: int, sizes: Sequence[int], seed: int) -> list[list[int]]:
    """Distinct points of ``range(space)`` for each split, drawn one at a time so that each split is a
    prefix-stable function of the seed and the sizes before it."""
    rng, seen, out = random.Random(seed), set(), []
    for size in sizes:
        split = []
        while len(split) < size:
            point = rng.randrange(space)
            if point not in seen:
                seen.add(point)
                split.append(point)
        out.append(split)
    return out


def build_split(task: PromptTask, points: Sequence[int], seed: int, bos: list[int]) -> list[Encoded]:
    """Render and tokenize the examples at ``points``; each example's extra randomness (fresh names)
    comes from its own generator seeded by ``(seed, point)``."""
    return [task.encode(task.prompt(p, random.Random(f"{seed}:{p}")), i, bos) for i, p in enumerate(points)]


class PromptDataset(Dataset):
    """The encoded examples of one split; ``task`` names the task ("ioi", "gp", "gt") so that whoever
    scores the batches knows what it reads without guessing from the batch keys."""

    def __init__(self, examples: list[Encoded], task: str = ""):
        self.examples, self.task = examples, task

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def collate_prompts(examples: Sequence[Encoded], pad_id: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of examples into the batch dict documented at the top of this module."""
    n, width = len(examples), max(len(e.clean_ids) for e in examples)
    clean = torch.full((n, width), pad_id, dtype=torch.long)
    corrupt = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for row, e in enumerate(examples):
        length = len(e.clean_ids)
        clean[row, :length] = torch.tensor(e.clean_ids)
        corrupt[row, :length] = torch.tensor(e.corrupt_ids)
        mask[row, :length] = 1
    batch = dict(
        clean_ids=clean,
        corrupt_ids=corrupt,
        attention_mask=mask,
        answer_pos=mask.sum(1) - 1,
        index=torch.tensor([e.index for e in examples]),
    )
    if examples[0].correct_id is not None:
        batch["correct_id"] = torch.tensor([e.correct_id for e in examples])
        batch["wrong_id"] = torch.tensor([e.wrong_id for e in examples])
    if examples[0].start_year is not None:
        greater = torch.zeros((n, vocab_size), dtype=torch.bool)
        lesser = torch.zeros((n, vocab_size), dtype=torch.bool)
        for row, e in enumerate(examples):
            greater[row, e.greater_ids] = True
            lesser[row, e.lesser_ids] = True
        batch.update(
            greater_mask=greater, lesser_mask=lesser, start_year=torch.tensor([e.start_year for e in examples])
        )
    return batch


class TaskDataModule(ResumableTrainOrder, pl.LightningDataModule):
    """Clean / corrupted prompt pairs of one task (see the module docstring for the batch format).

    Args:
        task: "ioi", "gp" (alias "gender_pronoun") or "gt" (alias "greater_than").
        tokenizer: a name or path for ``load_tokenizer`` ("smollm2-135m", "gpt2", a folder), or a
            tokenizer object when used from Python.
        n_train: training prompts (distinct examples; the splits are disjoint).
        n_val: validation prompts.
        n_test: test prompts (drawn first, so they do not change with the other sizes).
        batch_size: prompts per batch.
        seed: seeds the splits and every example's fresh names.
        order_seed: seeds the training loader's shuffle order (the training seed) and nothing else;
            None uses ``seed`` (the order every run used before this option existed).
        prepend_bos: put the tokenizer's BOS token first (as TransformerLens does for GPT-2).
        num_workers: DataLoader workers.
        test_last: draw the test split after validation and train (see the module docstring).
    """

    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.data_options:check_task_data_options"

    def __init__(
        self,
        task: Literal["ioi", "gp", "gt", "gender_pronoun", "greater_than"] = "ioi",
        tokenizer: Any = "smollm2-135m",
        n_train: int = 1000,
        n_val: int = 256,
        n_test: int = 256,
        batch_size: int = 64,
        seed: int = 0,
        prepend_bos: bool = False,
        num_workers: int = 0,
        test_last: bool = False,
        order_seed: int | None = None,
    ):
        super().__init__()
        check_task_data_options(task, n_train, n_val, n_test, batch_size)  # before the tokenizer loads
        self.tokenizer = resolve_tokenizer(tokenizer)
        self.task = make_task(task, self.tokenizer)
        total, space = n_train + n_val + n_test, self.task.space_size
        if total > space:
            raise ValueError(
                f"n_train + n_val + n_test = {total} exceeds the {space} distinct {self.task.name}"
                f" prompts that its templates and single-token words allow; ask for at most {space}"
            )
        bos = []
        if prepend_bos:
            if self.tokenizer.bos_token_id is None:
                raise ValueError("prepend_bos=True but the tokenizer has no BOS token; set prepend_bos=False")
            bos = [self.tokenizer.bos_token_id]
        if test_last:
            val, train, test = draw_points(space, (n_val, n_train, n_test), seed)
        else:
            test, val, train = draw_points(space, (n_test, n_val, n_train), seed)
        self.splits = {
            name: PromptDataset(build_split(self.task, points, seed, bos), self.task.name)
            for name, points in (("train", train), ("val", val), ("test", test))
        }
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers
        self.order_seed = seed if order_seed is None else order_seed

    def collate(self, examples):
        return collate_prompts(examples, self.tokenizer.pad_token_id, len(self.tokenizer))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        data = self.splits[split]
        rank, world = rank_and_world(self.trainer)
        kwargs: dict = dict(batch_size=self.batch_size, collate_fn=self.collate, num_workers=self.num_workers)
        if shuffle:  # Lightning swaps in a DistributedSampler under DDP
            kwargs.update(sampler=self.train_sampler(data, self.order_seed))
        elif world > 1:
            kwargs.update(sampler=ShardSampler(data, num_replicas=world, rank=rank))
        return DataLoader(data, **kwargs)

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("val", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)

    def predict_dataloader(self):
        return self._loader("test", shuffle=False)
