"""Document pools: JSONL, JSONL.gz and Parquet shards, streamed, with errors naming file, line, field."""

from __future__ import annotations

import gzip
import json

import pytest

from grpo_core.corpus.docs import CorpusError, Doc, read_docs, shards, write_jsonl

ROWS = [
    {"url": "https://a.example/x/1", "text": "one", "label": "math"},
    {"url": "https://b.example/y/2", "text": "two", "label": "nonmath"},
]


def test_jsonl_gz_and_parquet_shards_stream_in_order(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "a.jsonl").write_text(json.dumps(ROWS[0]) + "\n\n")
    write_jsonl(tmp_path / "pool" / "b.jsonl.gz", [ROWS[1]])
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "pool" / "c.parquet")
    (tmp_path / "pool" / "notes.txt").write_text("ignored")
    assert [p.name for p in shards(str(tmp_path / "pool"))] == ["a.jsonl", "b.jsonl.gz", "c.parquet"]
    docs = list(read_docs(str(tmp_path / "pool"), label_field="label"))
    assert docs == [Doc(r["url"], r["text"], r["label"]) for r in ROWS + ROWS]
    assert [d.url for d in read_docs(str(tmp_path / "pool" / "*.jsonl*"))] == [r["url"] for r in ROWS]


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"url": "u", "text": "t"}\n{"url": "u"\n', r"bad\.jsonl:2: invalid JSON"),
        (b'{"url": "u", "text": ""}\n', r"bad\.jsonl:1: field 'text' is missing, empty"),
        (b"[1, 2]\n", r"bad\.jsonl:1: expected a JSON object"),
        (b'{"url": "u", "text": "t"}\n{"url": "u", "text": "\xff\xfe"}\n', r"bad\.jsonl:2: not UTF-8"),
    ],
)
def test_malformed_documents_name_file_line_and_field(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        list(read_docs(str(tmp_path / "bad.jsonl")))


def test_missing_label_and_missing_pool_are_reported(tmp_path):
    (tmp_path / "seed.jsonl").write_text(json.dumps({"url": "u", "text": "t"}) + "\n")
    with pytest.raises(CorpusError, match=r"seed\.jsonl:1: field 'label'"):
        list(read_docs(str(tmp_path / "seed.jsonl"), label_field="label"))
    with pytest.raises(CorpusError, match="no such file"):
        shards(str(tmp_path / "absent"))
    with pytest.raises(CorpusError, match="no .jsonl"):
        shards(str(tmp_path / "*.parquet"))
    with gzip.open(tmp_path / "x.jsonl.gz", "wt") as f:
        f.write("")
    assert list(read_docs(str(tmp_path / "x.jsonl.gz"))) == []
