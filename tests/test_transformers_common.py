"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) on every zoo family and head.

The test module comes from the sdist of the installed transformers version (see `transformers_common.py`). Each
family declares its test classes beside its recipes (`FAMILY.common_tests` in training/recipes/<family>.py: a tiny
config, in the style of transformers' `BertModelTester`, the targets of its pretraining heads, and the common tests
that do not apply, each with its reason); this module builds one `<name>ModelTest` per declaration. Every other common
test must pass.

transformers' tests find a model's task by the class names in its `MODEL_FOR_*_MAPPING_NAMES` tables (e.g. to build
labels, or to leave bare models out of the training tests); a custom model registered with the Auto classes is not
in them. `_register_names` adds the zoo's classes to copies of those tables inside the test module only, from each
family's `AUTO_MAP` (transformers' own tables are left untouched).

    pytest -m common tests/test_transformers_common.py
"""

import contextlib
import unittest
import unittest.mock
from collections import OrderedDict

import pytest
import torch
from transformers_common import Unavailable, load

from encoder_zoo import models
from encoder_zoo.training.recipes import CommonTests, families

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

    def __init__(self, parent, spec: CommonTests):
        self.parent = parent
        self.spec = spec
        for name, value in spec.tester.items():
            setattr(self, name, value)

    def get_config(self):
        return self.spec.config(self)

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs = {"input_ids": input_ids}
        if self.use_input_mask:
            inputs["attention_mask"] = random_attention_mask([self.batch_size, self.seq_length])
        if self.use_token_type_ids:
            inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        return self.get_config(), inputs


# The common tests that compare two calls of a model: a model whose forward samples (`CommonTests.seeded_forward`) gets
# each call seeded alike.
COMPARING_TWO_CALLS = ("test_model_outputs_equivalence", "test_determinism", "test_save_load")


class ZooModelTest(ModelTesterMixin):
    """A family's `CommonTests` declaration run as transformers' common tests; `spec` is set per subclass."""

    spec: CommonTests

    def setUp(self):
        torch.manual_seed(0)
        self.model_tester = EncoderModelTester(self, self.spec)
        config_class = models.REGISTRY[self.spec.model_type]["AutoConfig"]
        self.config_tester = ConfigTester(self, config_class=config_class, **self.spec.config_tester)

    def pretraining_labels(self, inputs_dict, model_class):
        """The targets of a pretraining head, which transformers' `_prepare_for_class` does not know."""
        if self.spec.pretraining_labels is not None:
            return self.spec.pretraining_labels(inputs_dict["input_ids"], self.model_tester)
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

    def seeded(self, test_name: str):
        """Run the common test `test_name` with every forward of the `seeded_forward` classes seeded alike."""
        test = getattr(super(), test_name)
        with contextlib.ExitStack() as stack:
            for auto_name in self.spec.seeded_forward:
                cls = models.REGISTRY[self.spec.model_type][auto_name]

                def seeded_forward(model, *args, _forward=cls.forward, **kwargs):
                    torch.manual_seed(0)
                    return _forward(model, *args, **kwargs)

                stack.enter_context(unittest.mock.patch.object(cls, "forward", seeded_forward))
            test()

    def attention_outputs_per_head(self):
        """`test_attention_outputs` once per class, each with its number of kinds of hidden states."""
        classes = models.REGISTRY[self.spec.model_type]
        for model_class in type(self).all_model_classes:
            auto_name = next(name for name, cls in classes.items() if cls is model_class)
            with self.subTest(model_class.__name__):
                self.all_model_classes = (model_class,)
                self.model_tester.num_hidden_states_types = self.spec.hidden_states_types.get(auto_name, 1)
                super().test_attention_outputs()
        del self.all_model_classes


def seeded_test(name: str):
    def test(self):
        self.seeded(name)

    test.__name__ = test.__qualname__ = name
    return test


def model_test(spec: CommonTests) -> type:
    """The `unittest.TestCase` of one declaration: its classes, its seeded comparisons, its skips."""
    classes = models.REGISTRY[spec.model_type]
    heads = spec.heads or tuple(name for name in classes if name != "AutoConfig")  # the bare model first
    namespace = {
        "spec": spec,
        "all_model_classes": tuple(classes[name] for name in heads),
        "pretraining_classes": tuple(classes[name] for name in spec.pretraining_heads),
        "has_attentions": spec.has_attentions,
        "__module__": __name__,
        "__qualname__": f"{spec.name}ModelTest",
    }
    if spec.seeded_forward:
        namespace.update({name: seeded_test(name) for name in COMPARING_TWO_CALLS})
    if spec.hidden_states_types:
        namespace["test_attention_outputs"] = ZooModelTest.attention_outputs_per_head
    return skip_common_tests(spec.skips)(type(f"{spec.name}ModelTest", (ZooModelTest, unittest.TestCase), namespace))


MODEL_TESTS = [model_test(spec) for family in families().values() for spec in family.common_tests]
globals().update({cls.__name__: cls for cls in MODEL_TESTS})  # pytest collects classes by their names in the module
