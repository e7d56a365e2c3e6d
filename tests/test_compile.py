"""`--torch_compile`: the pretraining models trace with TorchDynamo into one graph for the encoders and heads. The only
graph breaks are the data-dependent index sets (`nonzero` of the targets), placed before the encoder."""

import pytest
import torch
import torch._dynamo
from test_spanbert_model import tester
from test_teams import masked_batch, tiny_config
from torch.nn import functional as F

from encoder_zoo import models  # noqa: F401  (registers the families)
from encoder_zoo.models.spanbert.modeling_spanbert import SpanBertForPreTraining
from encoder_zoo.models.teams.modeling_teams import TeamsForPreTraining
from encoder_zoo.training.data.packing import pack_batch


def pretraining_cases():
    return {
        "spanbert": (lambda: SpanBertForPreTraining(tester.config()), tester.inputs),
        "teams": (lambda: TeamsForPreTraining(tiny_config()), lambda: masked_batch()[0]),
    }


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("name", ["spanbert", "teams"])
def test_encoder_and_heads_trace_as_one_graph(name, packed):
    build, inputs = pretraining_cases()[name]
    torch.manual_seed(0)
    model = build()
    batch = pack_batch(inputs()) if packed else inputs()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda **kw: model(**kw).loss)(**batch)
    assert all("Dynamic shape operator" in str(b.reason) for b in explained.break_reasons), explained.break_reasons
    linear_layers = [sum(node.target is F.linear for node in graph.graph.nodes) for graph in explained.graphs]
    assert sum(count > 0 for count in linear_layers) == 1, linear_layers  # every matmul in one graph
    assert max(linear_layers) >= 6 * model.config.num_hidden_layers


@pytest.mark.parametrize("name", ["spanbert", "teams"])
def test_compiled_train_step_gives_the_eager_loss_and_gradients(name):
    build, inputs = pretraining_cases()[name]
    torch.manual_seed(0)
    model = build()
    torch._dynamo.reset()
    # Symbolic shapes from the start, as after the first recompile on a new number of targets.
    compiled = torch.compile(model, backend="eager", dynamic=True)
    batch = inputs()
    results = []
    for run in (model, compiled):
        torch.manual_seed(0)
        loss = run(**batch).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        model.zero_grad()
    (eager_loss, eager_gradients), (compiled_loss, compiled_gradients) = results
    torch.testing.assert_close(compiled_loss, eager_loss)
    for eager_gradient, compiled_gradient in zip(eager_gradients, compiled_gradients, strict=True):
        torch.testing.assert_close(compiled_gradient, eager_gradient)
