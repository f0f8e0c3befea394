"""CUDA graph buckets from the config (Triton's defaults, graph_spec) and how a batch finds its
graph. Capturing needs a GPU: tests/gpu/test_runtime_gpu.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig
from infermux.repository import load_model_config
from infermux.runtime import CudaGraphs, GraphBucket, GraphCaptureError, graph_buckets
from infermux.runtime.graphs import CapturedGraph, padding_sizes

GRAPHS = "optimization { cuda { graphs: true } }\n"


def config(
    tmp_path: Path, max_batch_size: int = 8, extra: str = GRAPHS, dims: str = "[ 4 ]"
) -> ModelConfig:
    model_dir = tmp_path / "m"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        f'name: "m"\nplatform: "pytorch_libtorch"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "x", data_type: TYPE_FP32, dims: {dims} }} ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]\n' + extra
    )
    return load_model_config(model_dir)


def sizes(buckets: tuple[GraphBucket, ...]) -> list[int]:
    return [b.batch_size for b in buckets]


def test_no_graphs_unless_the_config_asks(tmp_path: Path) -> None:
    assert graph_buckets(config(tmp_path, extra="")) == ()
    off = "optimization { cuda { graphs: false } }\n"
    assert graph_buckets(config(tmp_path, extra=off)) == ()


def test_without_dynamic_batching_tritons_sizes_plus_padding_sizes(tmp_path: Path) -> None:
    assert sizes(graph_buckets(config(tmp_path, 8))) == [1, 2, 3, 4, 6, 8]
    assert sizes(graph_buckets(config(tmp_path, 40))) == [1, 2, 3, 4, 6, *range(8, 41, 2)]
    assert sizes(graph_buckets(config(tmp_path, 5))) == [1, 2, 3, 4, 5]


def test_with_dynamic_batching_one_preferred_and_max_plus_padding_sizes(tmp_path: Path) -> None:
    extra = GRAPHS + "dynamic_batching { preferred_batch_size: [ 24, 36 ] }\n"
    buckets = graph_buckets(config(tmp_path, 128, extra))
    assert sizes(buckets) == [1, 2, 4, *range(8, 65, 2), *range(72, 129, 8)]
    assert all(b.lower_bound == 1 and b.dims == {"x": (4,)} for b in buckets)


@pytest.mark.parametrize("top", [9, 33, 100, 128, 1000])
def test_a_batch_over_eight_rows_pads_fewer_than_four_rows_or_an_eighth(top: int) -> None:
    buckets = padding_sizes(top)
    assert buckets[-1] <= top
    assert buckets == sorted(set(buckets))
    for rows in range(9, buckets[-1] + 1):
        bucket = min(b for b in buckets if b >= rows)
        assert bucket - rows < max(4, rows / 8), (rows, bucket)


@pytest.mark.parametrize("top", [9, 33, 64, 100])
def test_a_batch_of_eight_to_sixty_four_rows_pads_at_most_one_row(top: int) -> None:
    buckets = padding_sizes(top)
    for rows in range(8, min(64, buckets[-1]) + 1):
        assert min(b for b in buckets if b >= rows) - rows <= 1, rows


def test_graphs_grow_by_at_most_eight_per_doubling_of_the_largest_batch() -> None:
    assert len(padding_sizes(128)) == 40
    assert len(padding_sizes(1024)) == 40 + 3 * 8


def test_a_model_without_batching_has_one_graph(tmp_path: Path) -> None:
    (bucket,) = graph_buckets(config(tmp_path, 0))
    assert (bucket.batch_size, bucket.lower_bound, dict(bucket.dims)) == (0, 0, {"x": (4,)})


def test_graph_spec_is_taken_as_written(tmp_path: Path) -> None:
    spec = (
        "optimization { cuda { graphs: true graph_spec [\n"
        ' { batch_size: 8 input { key: "x" value { dim: [ 16 ] } } },\n'
        " { batch_size: 4 graph_lower_bound { batch_size: 3 }"
        ' input { key: "x" value { dim: [ 32 ] } } } ] } }\n'
    )
    buckets = graph_buckets(config(tmp_path, 8, spec, dims="[ -1 ]"))
    assert [(b.batch_size, b.lower_bound, dict(b.dims)) for b in buckets] == [
        (4, 3, {"x": (32,)}),
        (8, 1, {"x": (16,)}),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{ batch_size: 9 }", r"graph_spec\[0\]: batch_size must be in \[1, 8\], got 9"),
        ("{ batch_size: 0 }", r"batch_size must be in \[1, 8\], got 0"),
        (
            "{ batch_size: 4 graph_lower_bound { batch_size: 5 } }",
            r"graph_lower_bound.batch_size must be in \[1, 4\], got 5",
        ),
        (
            '{ batch_size: 4 input { key: "nope" value { dim: [ 4 ] } } }',
            "input 'nope' is not an input of the model",
        ),
        (
            '{ batch_size: 4 input { key: "x" value { dim: [ 4, 4 ] } } }',
            r"input 'x' dims \[4, 4\] do not fit the config's \[-1\]",
        ),
        (
            '{ batch_size: 4 input { key: "x" value { dim: [ 0 ] } } }',
            r"input 'x' dims \[0\] do not fit",
        ),
    ],
)
def test_an_invalid_graph_spec_is_a_load_error_naming_the_field(
    tmp_path: Path, spec: str, message: str
) -> None:
    extra = f"optimization {{ cuda {{ graphs: true graph_spec [ {spec} ] }} }}\n"
    with pytest.raises(ModelLoadError, match=message):
        graph_buckets(config(tmp_path, 8, extra, dims="[ -1 ]"))


def test_a_spec_for_a_model_without_batching_must_say_batch_size_0(tmp_path: Path) -> None:
    extra = "optimization { cuda { graphs: true graph_spec [ { batch_size: 2 } ] } }\n"
    with pytest.raises(ModelLoadError, match=r"batch_size must be 0 \(the model does not batch"):
        graph_buckets(config(tmp_path, 0, extra))


def test_variable_dims_without_a_spec_cannot_be_captured(tmp_path: Path) -> None:
    buckets = graph_buckets(config(tmp_path, 8, dims="[ -1 ]"))
    with pytest.raises(GraphCaptureError, match=r"input 'x' has variable dims \[-1\]"):
        CudaGraphs.capture(buckets, {}, lambda tensors: {}, cast(Any, None))


def fake_graphs(*buckets: GraphBucket) -> CudaGraphs:
    graphs = [CapturedGraph(b, cast(Any, None), {}, {}) for b in buckets]
    return CudaGraphs(graphs, buffer_bytes=0, pool=None, pool_bytes=0)


def test_a_batch_pads_up_to_the_smallest_bucket_that_holds_it() -> None:
    graphs = fake_graphs(*(GraphBucket(n, 1, {"x": (4,)}) for n in (8, 1, 2, 4)))
    assert graphs.batch_sizes == [1, 2, 4, 8]

    def found(rows: int, dims: tuple[int, ...] = (4,)) -> int | None:
        graph = graphs.find({"x": (rows, *dims)}, batching=True)
        return graph.bucket.batch_size if graph else None

    assert [found(n) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, None]
    assert found(2, (5,)) is None  # other shapes run eagerly
    assert graphs.find({}, batching=True) is None  # an optional input left out


def test_a_lower_bound_sends_smaller_batches_elsewhere() -> None:
    graphs = fake_graphs(GraphBucket(4, 3, {"x": (4,)}), GraphBucket(16, 9, {"x": (4,)}))
    found = [graphs.find({"x": (n, 4)}, batching=True) for n in (2, 3, 4, 5, 9)]
    assert [g.bucket.batch_size if g else None for g in found] == [None, 4, 4, None, 16]


def test_without_batching_the_whole_shape_must_match() -> None:
    graphs = fake_graphs(GraphBucket(0, 0, {"x": (3, 4)}))
    assert graphs.find({"x": (3, 4)}, batching=False) is graphs.graphs[0]
    assert graphs.find({"x": (2, 4)}, batching=False) is None
