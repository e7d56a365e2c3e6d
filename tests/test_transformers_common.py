"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) on every zoo family and head.

The test module comes from the sdist of the installed transformers version (see `transformers_common.py`); this
module holds only the per-family model testers (tiny configs, in the style of transformers' `BertModelTester`) and,
per family, the common tests that do not apply, each with its reason. Every other common test must pass.

transformers' tests find a model's task by the class names in its `MODEL_FOR_*_MAPPING_NAMES` tables (e.g. to build
labels, or to leave bare models out of the training tests); a custom model registered with the Auto classes is not
in them. `_register_names` adds the zoo's classes to copies of those tables inside the test module only, from each
family's `AUTO_MAP` (transformers' own tables are left untouched).

    pytest -m common tests/test_transformers_common.py
"""

import unittest
import unittest.mock
from collections import OrderedDict

import pytest
import torch
from transformers import BertConfig
from transformers_common import Unavailable, load

from encoder_zoo import models
from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig, BertacConfig
from encoder_zoo.models.cloze.configuration_cloze import TwoTowerClozeConfig
from encoder_zoo.models.hire.configuration_hire import HireConfig
from encoder_zoo.models.spanbert.configuration_spanbert import SpanBertConfig
from encoder_zoo.models.teams.configuration_teams import TeamsConfig

pytestmark = pytest.mark.common

try:
    common, configuration_common = load()
except Unavailable as error:
    pytest.skip(str(error), allow_module_level=True)

ModelTesterMixin, ConfigTester = common.ModelTesterMixin, configuration_common.ConfigTester
ids_tensor, random_attention_mask = common.ids_tensor, common.random_attention_mask

NAME_TABLES = {
    "AutoModel": "MODEL_MAPPING_NAMES",
    "AutoModelForPreTraining": "MODEL_FOR_PRETRAINING_MAPPING_NAMES",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
}


def _register_names():
    for auto_name, table in NAME_TABLES.items():
        names = OrderedDict(getattr(common, table))
        for model_type, classes in models.REGISTRY.items():
            if auto_name in classes:
                names[classes["AutoConfig"].model_type] = classes[auto_name].__name__
        setattr(common, table, names)


_register_names()


def skip_common_tests(reasons: dict[str, str]):
    """Replace the common tests whose names start with each key (parameterized tests expand to several) by a skip
    with its reason. A key that matches no test is an error, so the list cannot outlive the tests it names."""

    def decorate(cls):
        for prefix, reason in reasons.items():
            names = [name for name in dir(cls) if name.startswith(prefix) and callable(getattr(cls, name))]
            if not names:
                raise AssertionError(f"{cls.__name__}: no common test is named {prefix}*; drop it from the skip list.")
            for name in names:
                setattr(cls, name, unittest.skip(reason)(lambda self: None))
        return cls

    return decorate


def family_classes(name: str) -> tuple[type, ...]:
    """Every model class a family (or model type) registers: the bare model first, then its heads."""
    return tuple(cls for auto_name, cls in models.REGISTRY[name].items() if auto_name != "AutoConfig")


class EncoderModelTester:
    """The inputs and sizes transformers' common tests read (BertModelTester's), for any zoo family."""

    batch_size = 3
    seq_length = 7
    is_training = True
    use_input_mask = True
    use_token_type_ids = True
    vocab_size = 99
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 4
    intermediate_size = 37
    type_vocab_size = 2
    num_labels = 3

    def __init__(self, parent, **config_overrides):
        self.parent = parent
        self.config_overrides = config_overrides

    def get_config(self):
        raise NotImplementedError

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs = {"input_ids": input_ids}
        if self.use_input_mask:
            inputs["attention_mask"] = random_attention_mask([self.batch_size, self.seq_length])
        if self.use_token_type_ids:
            inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        return self.get_config(), inputs


class ZooModelTest(ModelTesterMixin):
    """Labels for the pretraining heads, which transformers' `_prepare_for_class` does not know."""

    def setUp(self):
        torch.manual_seed(0)

    pretraining_classes = ()

    def pretraining_labels(self, inputs_dict, model_class):
        labels = torch.full_like(inputs_dict["input_ids"], -100)
        labels[:, 1:4] = inputs_dict["input_ids"][:, 1:4]
        return {"labels": labels}

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        if return_labels and model_class in self.pretraining_classes:
            inputs_dict.update(self.pretraining_labels(inputs_dict, model_class))
        return inputs_dict

    def test_config(self):
        self.config_tester.run_common_tests()


# ============================================================================================================ SpanBERT
class SpanBertModelTester(EncoderModelTester):
    def get_config(self):
        return SpanBertConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
            type_vocab_size=self.type_vocab_size, max_position_embeddings=64, sbo_position_embedding_size=8,
            max_span_targets=4, **self.config_overrides,
        )




class SpanBertTestBase(ZooModelTest):
    config_overrides = {}

    def setUp(self):
        super().setUp()
        self.model_tester = SpanBertModelTester(self, **self.config_overrides)
        self.config_tester = ConfigTester(self, config_class=SpanBertConfig, hidden_size=37)

    def pretraining_labels(self, inputs_dict, model_class):
        labels = super().pretraining_labels(inputs_dict, model_class)
        # One span over positions 1..3 with its outside boundaries 0 and 4.
        span_left = torch.full_like(inputs_dict["input_ids"], -1)
        span_right = torch.full_like(inputs_dict["input_ids"], -1)
        span_left[:, 1:4], span_right[:, 1:4] = 0, 4
        labels.update(span_left=span_left, span_right=span_right)
        if self.config_overrides.get("use_next_sentence_prediction"):
            labels["next_sentence_label"] = torch.zeros(self.model_tester.batch_size, dtype=torch.long)
        return labels


SPANBERT_SKIPS = {}


@skip_common_tests(SPANBERT_SKIPS)
class SpanBertModelTest(SpanBertTestBase, unittest.TestCase):
    all_model_classes = family_classes("spanbert")
    pretraining_classes = (models.get_class("spanbert", "AutoModelForPreTraining"),)


@skip_common_tests(SPANBERT_SKIPS)
class SpanBertWithNspModelTest(SpanBertTestBase, unittest.TestCase):
    """The two-segment baselines (bert_2seq_nsp): BERT's NSP head and pooler."""

    config_overrides = {"use_next_sentence_prediction": True}
    all_model_classes = (models.get_class("spanbert", "AutoModelForPreTraining"),
                         models.get_class("spanbert", "AutoModelForSequenceClassification"))
    pretraining_classes = all_model_classes[:1]


# =============================================================================================================== TEAMS
class TeamsModelTester(EncoderModelTester):
    def get_config(self):
        return TeamsConfig(
            vocab_size=self.vocab_size, embedding_size=16, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size, type_vocab_size=self.type_vocab_size, max_position_embeddings=64,
            num_negatives=3, generator_num_hidden_layers=2, **self.config_overrides,
        )


class TeamsTestBase(ZooModelTest):
    config_overrides = {}
    all_model_classes = family_classes("teams")
    pretraining_classes = (models.get_class("teams", "AutoModelForPreTraining"),)

    def setUp(self):
        super().setUp()
        self.model_tester = TeamsModelTester(self, **self.config_overrides)
        self.config_tester = ConfigTester(self, config_class=TeamsConfig, hidden_size=37)

    def test_model_outputs_equivalence(self):
        SeededPretrainingForward().run(super().test_model_outputs_equivalence)

    def test_determinism(self):
        SeededPretrainingForward().run(super().test_determinism)

    def test_save_load(self):
        SeededPretrainingForward().run(super().test_save_load)


TEAMS_SKIPS = {}


class SeededPretrainingForward:
    """TeamsForPreTraining samples the replacements and the MWS candidates at random (Gumbel noise); the common
    tests that compare two calls of it compare calls seeded alike."""

    def run(self, test):
        cls = models.get_class("teams", "AutoModelForPreTraining")
        forward = cls.forward

        def seeded(model, *args, **kwargs):
            torch.manual_seed(0)
            return forward(model, *args, **kwargs)

        with unittest.mock.patch.object(cls, "forward", seeded):
            test()


@skip_common_tests(TEAMS_SKIPS)
class TeamsModelTest(TeamsTestBase, unittest.TestCase):
    pass


@skip_common_tests({
    "test_hidden_states_output": "ELECTRA's generator (TeamsForMaskedLM) is narrower than the discriminator by design: "
                                "its hidden states are generator_hidden_size wide (TeamsModelTest covers the heads at "
                                "one width)",
    "test_attention_outputs": "ELECTRA's generator (TeamsForMaskedLM) has fewer heads than the discriminator by design "
                              "(generator_num_attention_heads; TeamsModelTest covers the heads at one width)",
})
class ElectraModelTest(TeamsTestBase, unittest.TestCase):
    """ELECTRA on TEAMS' code path (`--model electra`): RTD only, a narrower generator, no shared layers."""

    config_overrides = dict(pretraining_tasks="rtd", task_head_type="ffn", layer_tying="none", generator_hidden_size=16,
                            generator_intermediate_size=24, generator_num_attention_heads=2)


# =============================================================================================================== Cloze
class ClozeModelTester(EncoderModelTester):
    model_width = 16
    # Every hidden state concatenates the forward and the backward tower's states: 2d wide.
    hidden_size = 2 * model_width
    use_token_type_ids = False

    def get_config(self):
        return TwoTowerClozeConfig(
            vocab_size=self.vocab_size, hidden_size=self.model_width, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
            max_position_embeddings=64, bos_token_id=1, eos_token_id=2, sep_token_id=3, **self.config_overrides,
        )


class ClozeTestBase(ZooModelTest):
    config_overrides = {}
    all_model_classes = family_classes("cloze")
    pretraining_classes = (models.get_class("cloze", "AutoModelForPreTraining"),
                           models.get_class("cloze", "AutoModelForMaskedLM"))
    # By design: the towers and the combination layer attend over a prepended zero state, and the model refuses
    # output_attentions with a clear error instead of returning maps that do not match its inputs.
    has_attentions = False

    def setUp(self):
        super().setUp()
        self.model_tester = ClozeModelTester(self, **self.config_overrides)
        self.config_tester = ConfigTester(self, config_class=TwoTowerClozeConfig, hidden_size=37,
                                          num_attention_heads=1)


    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        if return_labels and "labels" in inputs_dict and model_class.__name__ in ("TwoTowerCloze",
                                                                                  "TwoTowerClozeForMaskedLM"):
            # Targets in every band of the adaptive softmax, which trains a band only on the targets that fall in it.
            batch, length = inputs_dict["input_ids"].shape
            inputs_dict["labels"] = ((torch.arange(batch * length).view(batch, length) * 7)
                                     % self.model_tester.vocab_size)
        return inputs_dict


CLOZE_SKIPS = {
    "test_retain_grad_hidden_states_attentions": "by design each hidden state concatenates the two towers' states "
                                                 "after the fact (each tower reads its own half), so no gradient "
                                                 "flows into that concatenation; there are no attentions",
}
CHARACTER_CNN_SKIPS = {
    **CLOZE_SKIPS,
    "test_model_get_set_embeddings": "no embedding matrix by design: a character CNN spells each word from a saved "
                                     "word -> bytes table (set_input_embeddings refuses with a clear error)",
    "test_resize_tokens_embeddings": "no embedding matrix to compare row by row: resize_token_embeddings grows the "
                                     "word -> bytes table and the adaptive softmax (test_cloze_model.py checks it)",
}


@skip_common_tests(CLOZE_SKIPS)
class ClozeModelTest(ClozeTestBase, unittest.TestCase):
    pass


@skip_common_tests(CHARACTER_CNN_SKIPS)
class ClozeCharacterCnnModelTest(ClozeTestBase, unittest.TestCase):
    """The paper's CNN models: a character CNN spells each word, and an adaptive softmax predicts it."""

    config_overrides = dict(input_representation="char_cnn", use_adaptive_softmax=True,
                            adaptive_softmax_cutoff=[10, 40], character_embedding_size=4,
                            character_filters=[[1, 4], [2, 8]], max_word_characters=6)


# ================================================================================================================ HIRE
class HireModelTester(EncoderModelTester):
    gru_hidden_size = 8

    def backbone_config(self):
        return BertConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                          num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                          intermediate_size=self.intermediate_size, type_vocab_size=self.type_vocab_size,
                          max_position_embeddings=64)

    def get_config(self):
        return HireConfig(backbone_config=self.backbone_config().to_dict(), gru_hidden_size=self.gru_hidden_size,
                          num_labels=self.num_labels, **self.config_overrides)


HIRE_SKIPS = {
    "test_retain_grad_hidden_states_attentions": "by design HIRE runs its encoder right-aligned whatever the caller's "
                                                 "padding, and returns the encoder's hidden states and attentions "
                                                 "reordered to the caller's layout: copies, off the loss's graph",
}


@skip_common_tests(HIRE_SKIPS)
class HireModelTest(ZooModelTest, unittest.TestCase):
    all_model_classes = family_classes("hire")

    def setUp(self):
        super().setUp()
        self.model_tester = HireModelTester(self)
        self.config_tester = ConfigTester(self, config_class=HireConfig, has_text_modality=False)


# ============================================================================================================== BERTAC
class BertacModelTester(HireModelTester):
    def get_config(self):
        cnn = BertacCnnConfig(vocab_size=20, word_embedding_dim=8, filter_windows=[1, 2], num_filters=4,
                              mask_token_id=3)
        return BertacConfig(backbone_config=self.backbone_config().to_dict(), cnn_config=cnn.to_dict(),
                            num_tier_layers=2, separator_token_ids=[1, 2], word_lookup_size=4,
                            backbone_vocab_size=self.vocab_size, num_labels=self.num_labels, **self.config_overrides)


RANDOM_WORD_TABLE = ("the frozen word table is a buffer initialised at random by design (the authors' U(-0.1, 0.1) "
                     "for words without a fastText vector), so it cannot equal its zero __init__ value")
BERTAC_SKIPS = {
    "test_init_weights_can_init_buffers": RANDOM_WORD_TABLE,
    "test_inputs_embeds": "by design: BERTAC rebuilds its CNN's words from input_ids (inputs_embeds cannot be mapped "
                          "to words) and refuses inputs_embeds alone with a clear error",
}


@skip_common_tests(BERTAC_SKIPS)
class BertacModelTest(ZooModelTest, unittest.TestCase):
    all_model_classes = family_classes("bertac")

    def setUp(self):
        super().setUp()
        self.model_tester = BertacModelTester(self)
        self.config_tester = ConfigTester(self, config_class=BertacConfig, has_text_modality=False)

    def test_attention_outputs(self):
        # BertacModel returns two kinds of hidden states (the encoder's and the TIER layers'), the heads one.
        bare = models.get_class("bertac", "AutoModel")
        for model_class in type(self).all_model_classes:
            with self.subTest(model_class.__name__):
                self.all_model_classes = (model_class,)
                self.model_tester.num_hidden_states_types = 2 if model_class is bare else 1
                super().test_attention_outputs()
        del self.all_model_classes


class BertacCnnModelTester(EncoderModelTester):
    use_token_type_ids = False

    def get_config(self):
        return BertacCnnConfig(vocab_size=self.vocab_size, word_embedding_dim=8, filter_windows=[1, 2], num_filters=4,
                               mask_token_id=3)


BERTAC_CNN_SKIPS = {
    "test_init_weights_can_init_buffers": RANDOM_WORD_TABLE,
    "test_hidden_states_output": "no hidden states by design: a one-layer CNN pooled over time (its output is one "
                                 "vector)",
    "test_retain_grad_hidden_states_attentions": "no hidden states or attentions by design (a CNN pooled over time)",
    "test_feed_forward_chunking": "no feed-forward block to chunk (a CNN)",
    "test_model_get_set_embeddings": "the word table is a frozen buffer by design (BertacWordEmbeddings, never in an "
                                     "optimizer), not an nn.Embedding",
}


@skip_common_tests(BERTAC_CNN_SKIPS)
class BertacCnnModelTest(ZooModelTest, unittest.TestCase):
    all_model_classes = family_classes("bertac_cnn")
    pretraining_classes = (models.get_class("bertac_cnn", "AutoModelForPreTraining"),)
    has_attentions = False

    def setUp(self):
        super().setUp()
        self.model_tester = BertacCnnModelTester(self)
        self.config_tester = ConfigTester(self, config_class=BertacCnnConfig, common_properties=[])

    def pretraining_labels(self, inputs_dict, model_class):
        # Fixed real words (no [PAD]): both calls of a comparison get the same mentions.
        entity_ids = torch.arange(self.model_tester.batch_size * 3).view(-1, 3) % (self.model_tester.vocab_size - 4) + 4
        return {"entity_ids": entity_ids}
