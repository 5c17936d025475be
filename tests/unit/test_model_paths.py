"""The GGUF conversion's reader: the same fields and tensors as gguf's own reader, parsed once per file."""

import gguf
import numpy as np

from bridge_ray.model_paths import one_gguf_parse


def _write_small_gguf(path):
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_uint32("test.count", 7)
    writer.add_string("test.name", "bridge")
    writer.add_array("tokenizer.ggml.tokens", ["<pad>", "<bos>", "blue", "▁red"])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.25, 3.0])
    writer.add_tensor("token_embd.weight", np.arange(24, dtype=np.float32).reshape(4, 6))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_one_parse_per_file_reads_what_ggufs_reader_reads(tmp_path):
    path = tmp_path / "small.gguf"
    _write_small_gguf(path)
    expected = gguf.GGUFReader(path)
    original = gguf.GGUFReader
    with one_gguf_parse():
        reader = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is reader
    assert gguf.GGUFReader is original
    assert list(reader.fields) == list(expected.fields)
    for name, field in expected.fields.items():
        got = reader.fields[name]
        assert got.types == field.types and got.data == field.data, name
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got.parts, field.parts, strict=True))
    assert [(t.name, t.tensor_type, list(t.shape)) for t in reader.tensors] == [
        (t.name, t.tensor_type, list(t.shape)) for t in expected.tensors
    ]
    assert np.array_equal(reader.tensors[0].data, expected.tensors[0].data)
