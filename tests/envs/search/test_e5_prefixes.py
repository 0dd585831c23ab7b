"""e5's ``query: `` / ``passage: `` prefixes for dense retrieval (Search-R1's
``search_r1/search/retrieval_server.py``, ``Encoder.encode``, adds them when the retriever is e5).

No e5 model can be downloaded here, so the rule that picks the prefixes is checked on names, and
the prefixes themselves on the packaged all-MiniLM-L6-v2 with the prefixes given explicitly: the
index holds the embeddings of the prefixed documents and searches with the prefixed queries.
"""

import numpy as np
import pytest

from agentrl.tools.retriever import (
    DEFAULT_DENSE_MODEL,
    build_index,
    e5_prefixes,
    load_encoder,
    load_index,
)

DOCS = ["Lima\nLima is the capital of Peru.", "Rust\nRust was first released in 2015."]


@pytest.mark.parametrize(
    ("model", "prefixes"),
    [
        ("/models/intfloat/e5-base-v2", ("query: ", "passage: ")),
        ("/models/multilingual-E5-large", ("query: ", "passage: ")),
        (DEFAULT_DENSE_MODEL, ("", "")),
        ("/models/e5-base-v2/../all-MiniLM-L6-v2", ("", "")),
    ],
)
def test_e5_models_get_the_prefixes(model, prefixes):
    assert e5_prefixes(model) == prefixes


@pytest.mark.parametrize("prefixes", [("query: ", "passage: "), ("", "")])
def test_a_dense_index_embeds_and_searches_with_the_prefixes(tmp_path, prefixes):
    import datasets

    query_prefix, passage_prefix = prefixes
    documents = datasets.Dataset.from_dict(
        {
            "id": ["0", "1"],
            "title": [doc.split("\n")[0] for doc in DOCS],
            "text": [doc.split("\n")[1] for doc in DOCS],
            "contents": DOCS,
        }
    )
    path = build_index(
        documents,
        tmp_path / "dense",
        kind="dense",
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
    )
    index = load_index(path)
    assert index.meta["dense"]["query_prefix"] == query_prefix
    encoder = load_encoder(DEFAULT_DENSE_MODEL)
    expected = encoder.encode([passage_prefix + doc for doc in DOCS], normalize_embeddings=True)
    stored = index.index.reconstruct_n(0, len(DOCS))  # (N, D)
    np.testing.assert_allclose(stored, expected, atol=1e-5)
    [hits] = index.search(["capital of Peru"], 2)
    query = encoder.encode([query_prefix + "capital of Peru"], normalize_embeddings=True)[0]
    scores = {hit.document["id"]: hit.score for hit in hits}
    for row, doc_id in enumerate(["0", "1"]):
        assert scores[doc_id] == pytest.approx(float(expected[row] @ query), abs=1e-5)
