"""BenchOptions: bench's rules checked when the options are made, from Python as from the
CLI; runtimes chosen by name, runners by theirs."""
from __future__ import annotations

import pytest

from vit_export.benchmarking import BenchOptions, bench_options
from vit_export.errors import ConfigError


@pytest.mark.parametrize("keywords, message", [
    (dict(peers=["timm-ro"]), "unknown peer 'timm-ro'"),
    (dict(runtimes=["tensorrt"]), "unknown runtime 'tensorrt'"),
    (dict(batch_sizes=[0, 4]), "batch sizes must be >= 1"),
    (dict(batch_sizes=[]), "batch sizes must be >= 1"),
    (dict(min_runs=0), "min_runs >= 1"),
    (dict(threads=0), "threads must be >= 1"),
])
def test_each_rule_is_refused_when_the_options_are_made(keywords, message):
    with pytest.raises(ConfigError, match=message):
        BenchOptions(**keywords)


def test_openvino_is_a_runtime_by_name():
    assert bench_options(None, {"runtimes": ["openvino"]}).runtimes == ("openvino",)
    options = BenchOptions(batch_sizes=[1, 2], peers=["timm"])
    assert options.batch_sizes == (1, 2) and options.peers == ("timm",)
    assert bench_options(options, {"runtimes": ["openvino"]}).runtimes == ("openvino",)
    assert bench_options(options, {}) is options
    with pytest.raises(TypeError):  # the keyword bench took before runtimes were named
        bench_options(None, {"openvino": True})


def test_a_batch_size_given_twice_is_timed_once():
    """Each row is one batch size: [1, 1, 8] would time batch 1 twice under one key."""
    assert BenchOptions(batch_sizes=[1, 1, 8, 1]).batch_sizes == (1, 8)
    assert BenchOptions(runtimes=["openvino", "openvino"]).runtimes == ("openvino",)
