"""Tests of esync.worker.models: every network builds and runs, names and order are stable."""
import mxnet as mx
import pytest

from esync.worker import models

# AlexNet (224x224) and Inception-v3 (299x299) take seconds on a CPU core; the others < 1 s.
SLOW = {"alexnet", "inception-v3"}
EXPECTED = ["lenet", "alexnet", "resnet18-v1", "resnet50-v1", "resnet50-v2", "mobilenet-v1",
            "mobilenet-v2", "inception-v3"]


def test_the_original_seven_networks_and_lenet_are_there():
    assert sorted(models.NETWORKS) == sorted(EXPECTED)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in EXPECTED])
def test_forward_pass_gives_ten_scores_per_image(name):
    size = models.input_size(name)
    net = models.build(name, mx.cpu())
    out = net(mx.nd.random.uniform(shape=(2, 1, size, size)))
    assert out.shape == (2, 10)
    assert mx.nd.contrib.isfinite(out).min().asscalar() == 1


def test_unknown_network_lists_the_valid_names():
    with pytest.raises(models.UnknownNetworkError) as info:
        models.build("vgg99", mx.cpu())
    assert "vgg99" in str(info.value)
    for name in EXPECTED:
        assert name in str(info.value)


def test_input_size_of_unknown_network_is_an_unknown_network_error():
    with pytest.raises(models.UnknownNetworkError):
        models.input_size("vgg99")


@pytest.mark.parametrize("name", ["lenet", "resnet18-v1"])
def test_parameter_names_and_order_are_identical_across_builds(name):
    first = models.named_parameters(models.build(name, mx.cpu()))
    second = models.named_parameters(models.build(name, mx.cpu()))
    assert list(first) == list(second)
    assert [p.shape for p in first.values()] == [p.shape for p in second.values()]


def test_parameter_names_are_structural_not_counters():
    names = list(models.named_parameters(models.build("lenet", mx.cpu())))
    assert names[0] == "0.weight" and names[-1] == "6.bias"


def test_same_seed_gives_same_initial_weights():
    a = models.named_parameters(models.build("lenet", mx.cpu(), seed=3))
    b = models.named_parameters(models.build("lenet", mx.cpu(), seed=3))
    c = models.named_parameters(models.build("lenet", mx.cpu(), seed=4))
    w = "0.weight"
    assert (a[w].data() == b[w].data()).min().asscalar() == 1
    assert (a[w].data() != c[w].data()).max().asscalar() == 1


def test_batch_norm_running_stats_are_aux_in_resnet18():
    trainable, aux = models.trainable_and_aux(models.build("resnet18-v1", mx.cpu()))
    means = [p for p in aux if p.name.endswith("running_mean")]
    variances = [p for p in aux if p.name.endswith("running_var")]
    assert means and len(means) == len(variances) and len(aux) == len(means) + len(variances)
    assert not any(p.name.endswith(("running_mean", "running_var")) for p in trainable)
    assert all(p.grad_req != "null" for p in trainable)


def test_lenet_has_no_aux_states():
    trainable, aux = models.trainable_and_aux(models.build("lenet", mx.cpu()))
    assert aux == [] and len(trainable) == 8
