"""SpanBERT masking as a vectorised, seeded, dynamic data collator.

Schemes (the paper's Table 6 ablations):
    subword       random word pieces (BERT)
    whole_word    random whole words
    span          geometric spans of whole words, Geo(p=0.2) clipped at 10 words (SpanBERT)
    named_entity  spaCy named entities half of the time, else whole words
    noun_phrase   spaCy noun chunks half of the time, else whole words

Faithful to the authors' code where the paper is silent: the budget is ceil(15% of the block's word pieces); a
span's anchor is drawn uniformly over word pieces and snapped back to its word start; an anchor that is already
masked is skipped; the budget is enforced token by token; overlapping or adjacent spans are merged before
replacement and before SBO targets are built; 80/10/10 is decided once per (merged) span; random replacements
follow the corpus unigram distribution (or the uniform one). [UNK] is a text token like any other (maskable, part of
its word, a valid boundary), so the budget is always met. A merged span whose outside boundary is not a text token of
the block ([CLS], [SEP] or padding) gets no SBO targets; the model drops targets beyond `config.max_span_targets`.

Every random draw is a pure function of (seed, epoch, example index): see `ExampleRandomness`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

SCHEMES = ("subword", "whole_word", "span", "named_entity", "noun_phrase")
LINGUISTIC_SCHEMES = ("named_entity", "noun_phrase")


# Philox counter words: (draw number, epoch, stream, 0); training and evaluation draw from different streams, and a
# model's samplers (`sampler_draws`) from streams of their own, so asking for them leaves the masks as they were.
TRAIN_STREAM, EVAL_STREAM = 0, 1
SAMPLER_STREAM_OFFSET = 2
# The largest float32 below 1: a float64 draw rounded to float32 could reach 1.0.
BELOW_ONE = np.float32(1 - 2**-24)
INDEX_COLUMN = "example_index"


class ExampleRandomness:
    """Uniform draws keyed by (seed, epoch, example index) with numpy's counter-based Philox generator.

    Each example gets its own Philox key (seed, index) and counter (0, epoch, stream, 0), so its draws never depend
    on which examples share its batch, the padding width, the DataLoader worker, the world size or a restart. The
    epoch lives in a shared-memory tensor: `set_epoch` in the main process reaches DataLoader workers whether they
    are forked per epoch or persistent.
    """

    def __init__(self, seed: int, stream: int = TRAIN_STREAM):
        self.seed = seed % 2**64
        self.stream = stream
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._bit_generator = np.random.Philox(key=[self.seed, 0])
        self._generator = np.random.Generator(self._bit_generator)

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    def uniforms(self, index: int, size: int, sampler: bool = False) -> np.ndarray:
        """`size` draws in [0, 1) of example `index` at the current epoch; a longer draw extends a shorter one.
        `sampler`: from the sampler's stream (`SpanMaskingCollator(sampler_draws=...)`), not the masks'."""
        stream = self.stream + (SAMPLER_STREAM_OFFSET if sampler else 0)
        self._bit_generator.state = {
            "bit_generator": "Philox",
            "state": {"counter": np.array([0, self.epoch, stream, 0], dtype=np.uint64),
                      "key": np.array([self.seed, int(index) % 2**64], dtype=np.uint64)},
            "buffer": np.zeros(4, dtype=np.uint64), "buffer_pos": 4, "has_uint32": 0, "uinteger": 0,
        }
        return self._generator.random(size)

    def for_evaluation(self) -> "ExampleRandomness":
        """Draws for held-out examples: fixed (no epoch), so the same model and data always score the same."""
        return ExampleRandomness(self.seed, EVAL_STREAM)


def truncated_geometric_probs(p: float, max_length: int) -> np.ndarray:
    """P(length = 1..max_length) for Geo(p) truncated at max_length and renormalised."""
    lengths = np.arange(1, max_length + 1)
    probs = p * (1 - p) ** (lengths - 1)
    return probs / probs.sum()


def max_targets(mlm_probability: float, width: int) -> int:
    """The most targets a row of `width` positions can get: its budget is ceil(rate x its maskable tokens)."""
    return max(math.ceil(width * mlm_probability), 1)


def target_buffer(masked: np.ndarray, size: int) -> np.ndarray:
    """The fixed-size target buffer `(B, size)`: each row's masked positions, ascending, then -1.

    Its shape follows the batch's shape and the masking rate only, so a train step that reads it has no
    data-dependent shape (the models need no host sync to count the targets). Refuses a row with more targets.
    """
    counts = masked.sum(1)
    if counts.max(initial=0) > size:
        raise ValueError(f"A row has {int(counts.max())} masked targets, more than the target buffer's {size} slots "
                         "(ceil(mlm_probability x width)); the masking budget was exceeded.")
    order = np.argsort(~masked, axis=1, kind="stable")[:, :size]  # masked positions first, in order
    return np.where(np.take_along_axis(masked, order, axis=1), order, -1).astype(np.int64)


class SpanMaskingCollator:
    """Pads examples of `input_ids` + `word_start` (+ `linguistic_span`) and masks them.

    Returns `input_ids`, `attention_mask`, `labels` (-100 where not masked) and, with `span_boundary_targets`,
    `span_left` / `span_right` (outside boundary positions of each SBO target's merged span, -1 elsewhere). With
    `target_buffer`, also `target_positions` (see `target_buffer`): the models then run a step without a host sync.
    With `sampler_draws` D > 0, also `sampler_uniforms` `(B, T, D)`: each position's draws for a model that samples
    at its targets (TEAMS's generator, `TeamsConfig.sampler_draws`), keyed like the masks, so a global batch split
    otherwise samples the same tokens.
    Every example needs its `example_index` (`training.data.add_example_index`): its mask is a pure function of
    (seed, epoch, index), new each epoch (dynamic masking, `set_epoch`) and identical after a restart.
    """

    def __init__(
        self,
        tokenizer,
        scheme: str = "span",
        mlm_probability: float = 0.15,
        geometric_p: float = 0.2,
        max_span_length: int = 10,
        replacement_unit: str | None = None,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        random_token_distribution: str = "unigram",
        unigram_probs: np.ndarray | None = None,
        linguistic_probability: float = 0.5,
        span_boundary_targets: bool = True,
        pad_to_multiple_of: int | None = 8,
        seed: int = 0,
        target_buffer: bool = False,
        sampler_draws: int = 0,
    ):
        if scheme not in SCHEMES:
            raise ValueError(f"Unknown masking scheme {scheme!r}; choose one of {', '.join(SCHEMES)}.")
        if not 0 < mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}.")
        if mask_replace_prob + random_replace_prob > 1:
            raise ValueError("mask_replace_prob + random_replace_prob must not exceed 1.")
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("The tokenizer needs a mask token and a pad token for masked-LM pretraining.")
        self.tokenizer = tokenizer
        self.scheme = scheme
        self.mlm_probability = mlm_probability
        self.length_probs = truncated_geometric_probs(geometric_p, max_span_length)
        # BERT decides 80/10/10 per token; the SpanBERT recipe once per span.
        self.replacement_unit = replacement_unit or ("token" if scheme == "subword" else "span")
        if self.replacement_unit not in ("token", "span"):
            raise ValueError(f"replacement_unit must be 'token' or 'span', got {replacement_unit!r}.")
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.linguistic_probability = linguistic_probability
        self.span_boundary_targets = span_boundary_targets
        self.pad_to_multiple_of = pad_to_multiple_of
        self.target_buffer = target_buffer
        self.sampler_draws = sampler_draws
        self.randomness = ExampleRandomness(seed)

        vocab_size = len(tokenizer)
        # [UNK] stands for a word of the text: the authors' code masks it like any other token.
        self.special_ids = np.array(sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}), dtype=np.int64)
        if random_token_distribution == "unigram":
            if unigram_probs is None:
                raise ValueError("random_token_distribution='unigram' needs unigram_probs (see "
                                 "data.unigram_distribution).")
            probs = np.asarray(unigram_probs, dtype=np.float64)[:vocab_size].copy()
        elif random_token_distribution == "uniform":
            probs = np.ones(vocab_size)
        else:
            raise ValueError("random_token_distribution must be 'unigram' or 'uniform', got "
                             f"{random_token_distribution!r}.")
        probs[self.special_ids[self.special_ids < vocab_size]] = 0
        self.random_token_cdf = np.cumsum(probs / probs.sum())

    # ------------------------------------------------------------------ randomness
    def set_epoch(self, epoch: int) -> None:
        """Draw the masks of training epoch `epoch` (`training.trainer.PretrainingTrainer` calls it)."""
        self.randomness.set_epoch(epoch)

    def for_evaluation(self) -> "SpanMaskingCollator":
        """A copy whose masks ignore the epoch: held-out losses are the same for the same model and data. Without the
        target buffer: evaluation reads one logit row per target, and its speed is not the step's."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__, randomness=self.randomness.for_evaluation(), target_buffer=False)
        return copy

    def span_lengths(self, uniforms: np.ndarray) -> np.ndarray:
        """Span lengths in words from the truncated geometric distribution, one per uniform draw."""
        return np.searchsorted(np.cumsum(self.length_probs), uniforms, side="right") + 1

    def _draws(self, examples, n_candidates: np.ndarray, lengths: np.ndarray, width: int) -> dict[str, np.ndarray]:
        """Each example's uniforms, cut into named streams: per candidate span (n_candidates[row] of them) and per
        position of the example. Cells past a row's own count hold draws of other streams and must stay unused."""
        per_candidate = {"subword": (), "span": ("anchor", "span_length")}.get(self.scheme, ("anchor",))
        if self.scheme in LINGUISTIC_SCHEMES:
            per_candidate += ("unit_choice", "unit_use")
        per_position = ("replacement", "random_token") + (("token_key",) if self.scheme == "subword" else ())
        batch, most = len(examples), int(n_candidates.max(initial=0))
        draws = {name: np.zeros((batch, most)) for name in per_candidate}
        draws.update({name: np.zeros((batch, width)) for name in per_position})
        for row, example in enumerate(examples):
            if INDEX_COLUMN not in example:
                raise ValueError(f"Masking needs an `{INDEX_COLUMN}` column: add it with "
                                 "encoder_zoo.training.data.blocks.add_example_index(dataset), so masks are a function "
                                 "of the example.")
            n, length = n_candidates[row], lengths[row]
            uniforms = self.randomness.uniforms(example[INDEX_COLUMN],
                                                n * len(per_candidate) + length * len(per_position))
            for offset, name in enumerate(per_candidate):
                draws[name][row, :n] = uniforms[offset * n : (offset + 1) * n]
            start = n * len(per_candidate)
            for offset, name in enumerate(per_position):
                draws[name][row, :length] = uniforms[start + offset * length : start + (offset + 1) * length]
        return draws

    # ------------------------------------------------------------------ main entry
    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("Cannot collate an empty batch.")
        lengths = np.array([len(e["input_ids"]) for e in examples])
        width = int(lengths.max())
        if self.pad_to_multiple_of:
            width = int(math.ceil(width / self.pad_to_multiple_of) * self.pad_to_multiple_of)
        batch = len(examples)
        ids = np.full((batch, width), self.tokenizer.pad_token_id, dtype=np.int64)
        word_start = np.zeros((batch, width), dtype=bool)
        units = np.full((batch, width), -1, dtype=np.int64)
        needs_words = self.scheme != "subword"
        for row, example in enumerate(examples):
            ids[row, : lengths[row]] = example["input_ids"]
            if needs_words:
                if "word_start" not in example:
                    raise ValueError(
                        f"Masking scheme {self.scheme!r} needs a `word_start` column (see training.data.pack_blocks)."
                    )
                word_start[row, : lengths[row]] = example["word_start"]
            if self.scheme in LINGUISTIC_SCHEMES:
                if "linguistic_span" not in example:
                    raise ValueError(
                        f"Masking scheme {self.scheme!r} needs spaCy spans: pack blocks with "
                        f"annotate_spans={self.scheme!r}."
                    )
                units[row, : lengths[row]] = example["linguistic_span"]
        positions = np.arange(width)
        attention_mask = positions[None, :] < lengths[:, None]
        maskable = attention_mask & ~np.isin(ids, self.special_ids)
        # Refused, not trained as a zero-target step: the trainer has no step without targets. A NaN loss would stop
        # the run as diverged (DivergenceGuard, blaming the learning rate); a zero one would still move every weight
        # (AdamW's momentum and decay) and pull the logged loss means towards 0.
        if not maskable.any():
            raise ValueError(f"{type(self).__name__}: none of this batch's {batch} examples has a token to mask (only "
                             "padding and special tokens): drop such empty examples from the corpus or shards.")
        budget = np.ceil(maskable.sum(1) * self.mlm_probability).astype(np.int64)
        # Candidate spans per row, a function of the row alone (enough to meet the budget but in rare cases).
        n_candidates = np.where(self.scheme == "subword", 0, (budget * 1.5).astype(np.int64) + 10)
        draws = self._draws(examples, n_candidates, lengths, width)

        if self.scheme == "subword":
            masked = self._mask_random_tokens(maskable, budget, draws["token_key"])
        else:
            # A block cut inside a word starts with a continuation piece: it opens a (partial) word here.
            word_start = (word_start | ~np.pad(maskable, ((0, 0), (1, 0)))[:, :-1]) & maskable
            masked = self._mask_spans(maskable, word_start, units, budget, n_candidates, draws)

        labels = np.where(masked, ids, -100)
        inputs = self._replace(ids, masked, draws)
        result = {
            "input_ids": torch.from_numpy(inputs),
            "attention_mask": torch.from_numpy(attention_mask.astype(np.int64)),
            "labels": torch.from_numpy(labels),
        }
        if self.span_boundary_targets:
            left, right = self._span_boundaries(masked, maskable)
            result["span_left"], result["span_right"] = torch.from_numpy(left), torch.from_numpy(right)
        if self.target_buffer:
            result["target_positions"] = torch.from_numpy(target_buffer(masked, max_targets(self.mlm_probability,
                                                                                              width)))
        if self.sampler_draws:
            result["sampler_uniforms"] = torch.from_numpy(self._sampler_uniforms(examples, lengths, width))
        return result

    def _sampler_uniforms(self, examples, lengths: np.ndarray, width: int) -> np.ndarray:
        """`(B, width, sampler_draws)` float32 draws in [0, 1) from each example's sampler stream, position by
        position (0 in the padding)."""
        draws = np.zeros((len(examples), width, self.sampler_draws), dtype=np.float32)
        for row, example in enumerate(examples):
            uniforms = self.randomness.uniforms(example[INDEX_COLUMN], lengths[row] * self.sampler_draws, sampler=True)
            draws[row, : lengths[row]] = np.minimum(uniforms.astype(np.float32), BELOW_ONE).reshape(lengths[row], -1)
        return draws

    # ------------------------------------------------------------------ selection
    def _mask_random_tokens(self, maskable: np.ndarray, budget: np.ndarray, token_keys: np.ndarray) -> np.ndarray:
        keys = np.where(maskable, token_keys, np.inf)
        ranks = np.argsort(np.argsort(keys, axis=1), axis=1)
        return ranks < budget[:, None]

    def _mask_spans(self, maskable, word_start, units, budget, row_candidates, draws) -> np.ndarray:
        batch, width = maskable.shape
        n_candidates = draws["anchor"].shape[1]

        # Words as token intervals, in flat (row-major) coordinates.
        flat_start = np.flatnonzero(word_start)
        token_word = np.cumsum(word_start.ravel()) - 1  # word index of every token (valid where maskable)
        word_lengths = np.bincount(token_word[maskable.ravel()], minlength=len(flat_start))
        word_row = flat_start // width
        row_last_word = np.searchsorted(word_row, np.arange(batch), side="right") - 1

        # Anchors: uniform over the row's word pieces, snapped back to the start of their word.
        maskable_flat = np.flatnonzero(maskable)
        row_offsets = np.concatenate([[0], np.cumsum(maskable.sum(1))])
        counts = np.maximum(row_offsets[1:] - row_offsets[:-1], 1)
        picks = row_offsets[:-1, None] + (draws["anchor"] * counts[:, None]).astype(np.int64)
        has_words = (row_offsets[1:] > row_offsets[:-1])[:, None]
        anchor_word = (token_word[maskable_flat[np.minimum(picks, len(maskable_flat) - 1)]] if len(maskable_flat)
                       else np.zeros_like(picks))
        span_words = self.span_lengths(draws["span_length"]) if self.scheme == "span" else np.ones_like(picks)
        last_word = np.minimum(anchor_word + span_words - 1, row_last_word[:, None])
        start = flat_start[anchor_word] - np.arange(batch)[:, None] * width if len(flat_start) else np.zeros_like(picks)
        end = ((flat_start[last_word] + word_lengths[last_word]) - np.arange(batch)[:, None] * width if len(flat_start)
               else np.zeros_like(picks))

        if self.scheme in LINGUISTIC_SCHEMES:
            start, end = self._linguistic_candidates(units, start, end, draws)
        # Rows without words, and candidates past a row's own count, cover nothing.
        start = np.where(has_words, start, 0)
        end = np.where(has_words & (np.arange(n_candidates) < row_candidates[:, None]), end, start)

        # Sequential semantics, vectorised: a candidate whose anchor an earlier active candidate already covers is
        # skipped; tokens are then claimed in candidate order until the budget is spent. Work on the covered
        # (row, position, candidate) triples only, never on a (batch, candidates, width) grid.
        lengths = np.maximum(end - start, 0).ravel()
        candidate = np.repeat(np.arange(lengths.size), lengths)  # flat candidate id = row * n_candidates + k
        position = (start.ravel()[candidate] + np.arange(candidate.size)
                    - np.repeat(np.cumsum(lengths) - lengths, lengths))
        row, order = candidate // n_candidates, candidate % n_candidates
        cell = row * width + position

        def owners(keep):
            """Per covered cell, the first (lowest-order) kept candidate covering it; n_candidates where none."""
            owner = np.full(batch * width, n_candidates, dtype=np.int64)
            np.minimum.at(owner, cell[keep], order[keep])
            return owner

        active = np.ones(lengths.size, dtype=bool)
        anchor_cell = (np.arange(batch)[:, None] * width + np.minimum(start, width - 1)).ravel()
        for _ in range(3):  # a fixed point is reached in a couple of rounds
            owner = owners(active[candidate])
            updated = owner[anchor_cell] >= np.tile(np.arange(n_candidates), batch)
            if np.array_equal(updated, active):
                break
            active = updated
        owner = owners(active[candidate])
        claimed = np.flatnonzero(owner < n_candidates)
        claimed = claimed[np.lexsort((claimed % width, owner[claimed], claimed // width))]  # by row, then claim order
        claimed_row = claimed // width
        rank = np.arange(claimed.size) - np.searchsorted(claimed_row, claimed_row)
        masked = np.zeros(batch * width, dtype=bool)
        masked[claimed[rank < budget[claimed_row]]] = True
        return masked.reshape(batch, width) & maskable

    def _linguistic_candidates(self, units, word_start_pos, word_end_pos, draws):
        """Half of the candidates (per `linguistic_probability`) become a random spaCy span of the row."""
        batch, n_candidates = word_start_pos.shape
        width = units.shape[1]
        n_units = units.max(1) + 1
        unit_ids = np.arange(max(int(n_units.max()), 1))
        inside = units[:, None, :] == unit_ids[None, :, None]  # (B, U, T)
        present = inside.any(2)
        unit_start = np.where(present, np.argmax(inside, axis=2), 0)
        unit_end = np.where(present, width - np.argmax(inside[:, :, ::-1], axis=2), 0)
        # Pick among the units present in the row (ids may have gaps).
        present_count = present.sum(1)
        choice = (draws["unit_choice"] * np.maximum(present_count, 1)[:, None]).astype(np.int64)
        present_ids = np.argsort(~present, axis=1, kind="stable")  # present unit ids first
        picked = np.take_along_axis(present_ids, choice, axis=1)
        use_unit = (draws["unit_use"] < self.linguistic_probability) & (present_count > 0)[:, None]
        start = np.where(use_unit, np.take_along_axis(unit_start, picked, axis=1), word_start_pos)
        end = np.where(use_unit, np.take_along_axis(unit_end, picked, axis=1), word_end_pos)
        return start, end

    # ------------------------------------------------------------------ replacement and SBO targets
    def _replace(self, ids: np.ndarray, masked: np.ndarray, random_draws: dict[str, np.ndarray]) -> np.ndarray:
        draws = random_draws["replacement"]
        if self.replacement_unit == "span":  # every token of a merged span takes the draw of its first position
            run_start = masked & ~np.pad(masked, ((0, 0), (1, 0)))[:, :-1]
            run_id = np.cumsum(run_start.ravel()) - 1
            draws = draws[run_start][np.maximum(run_id, 0)].reshape(masked.shape) if run_start.any() else draws
        to_mask = masked & (draws < self.mask_replace_prob)
        to_random = (masked & (draws >= self.mask_replace_prob)
                     & (draws < self.mask_replace_prob + self.random_replace_prob))
        out = ids.copy()
        out[to_mask] = self.tokenizer.mask_token_id
        n_random = int(to_random.sum())
        if n_random:
            out[to_random] = np.searchsorted(self.random_token_cdf, random_draws["random_token"][to_random],
                                             side="right")
        return out

    def _span_boundaries(self, masked: np.ndarray, maskable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        batch, width = masked.shape
        positions = np.broadcast_to(np.arange(width), masked.shape)
        left = np.maximum.accumulate(np.where(masked, -1, positions), axis=1)
        right = np.minimum.accumulate(np.where(masked, width, positions)[:, ::-1], axis=1)[:, ::-1]
        rows = np.arange(batch)[:, None]
        inside = (left >= 0) & (right < width)
        left_ok = maskable[rows, np.clip(left, 0, width - 1)]
        right_ok = maskable[rows, np.clip(right, 0, width - 1)]
        target = masked & inside & left_ok & right_ok
        return np.where(target, left, -1), np.where(target, right, -1)
