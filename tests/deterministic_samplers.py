"""Test-only launcher: `python tests/deterministic_samplers.py SCRIPT ARGS...` (or under `accelerate launch`) runs
SCRIPT with TEAMS's generator samplers made deterministic: the replacement of each masked token is the generator's
most likely token, and the MWS candidates its most likely other tokens (`negative_sampling="hardest"`).

TEAMS draws its Gumbel noise from each process's torch stream, at each micro-batch's shape, so the same examples
split otherwise (1 x 8 against 2 x 4) draw other replacements, as dropout draws other masks. The elastic tests turn
both off to compare how an update weighs its targets, nothing else.
"""

import runpy
import sys

from encoder_zoo.models.teams import modeling_teams


def _most_likely(logits, generator=None):
    return logits.detach().argmax(dim=-1)


def _hardest(logits, originals, num_negatives, strategy="sampled", generator=None):
    return _sample_candidates(logits, originals, num_negatives, "hardest", generator)


_sample_candidates = modeling_teams.sample_candidates
modeling_teams.sample_replacements = _most_likely
modeling_teams.sample_candidates = _hardest
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
