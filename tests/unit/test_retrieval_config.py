import pytest

from bridge_ray.config import ConfigError, load_config
from bridge_ray.config.encoders import BGE_QUERY_INSTRUCTION, EncoderSpec


def test_retrieval_defaults():
    r = load_config().retrieval
    assert r.encoder.spec() == EncoderSpec("all-MiniLM-L6-v2", "mean", True, "", "", 256, 256)
    assert (r.lora.rank, r.lora.alpha, r.lora.dropout, r.lora.target_modules) == (16, 16.0, 0.0, None)
    assert (r.index.num_shards, r.index.index_type, r.index.dir) == (1, "flat", None)
    assert r.server.host == "127.0.0.1"  # never exposed to the network unless asked


def test_presets_fill_unset_fields_and_explicit_values_win():
    e5 = load_config(None, ["retrieval.encoder.name=intfloat/e5-base-v2"]).retrieval.encoder.spec()
    assert (e5.pooling, e5.normalize, e5.query_prefix, e5.passage_prefix) == ("mean", True, "query: ", "passage: ")
    bge = load_config(None, ["retrieval.encoder.name=BAAI/bge-base-en-v1.5", "retrieval.encoder.normalize=false"])
    spec = bge.retrieval.encoder.spec()
    assert (spec.pooling, spec.normalize, spec.query_prefix) == ("cls", False, BGE_QUERY_INSTRUCTION)
    custom = load_config(None, ["retrieval.encoder.name=/models/mine", "retrieval.encoder.pooling=cls",
                                "retrieval.encoder.normalize=true"]).retrieval.encoder.spec()
    assert (custom.model, custom.pooling, custom.query_prefix) == ("/models/mine", "cls", "")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["retrieval.encoder.name=/models/mine"], r"retrieval\.encoder: .*set pooling and normalize"),
        (["retrieval.encoder.pooling=max"], r"retrieval\.encoder\.pooling"),
        (["retrieval.lora.rank=0"], r"retrieval\.lora\.rank"),
        (["retrieval.lora.dropout=1.0"], r"retrieval\.lora\.dropout"),
        (["retrieval.lora.target_modules=query"], r"retrieval\.lora\.target_modules"),
        (["retrieval.index.index_type=annoy"], r"retrieval\.index\.index_type"),
        (["retrieval.index.ivf_nlist=8", "retrieval.index.ivf_nprobe=16"], r"retrieval\.index: ivf_nprobe \(16\)"),
        (["retrieval.server.port=70000"], r"retrieval\.server\.port"),
        (["retrieval.server.default_topk=200"], r"retrieval\.server: default_topk"),
        (["retrieval.server.max_queries_per_request=2000"],
         r"retrieval\.server: max_queries_per_request was removed: .*retrieval\.server\.max_request_bytes"),
        (["retrieval.index.shards=2"], r"retrieval\.index\.shards: unknown key \(did you mean 'num_shards'\?\)"),
    ],
)
def test_invalid_retrieval_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_command_flags_are_validated_as_the_keys_they_set(tmp_path, capsys):
    from bridge_ray.cli import main

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "0", "contents": "T\\nx"}\n')
    rc = main(["build-index", "--corpus", str(corpus), "--out", str(tmp_path / "i"), "--shards", "0"])
    assert rc == 2 and "retrieval.index.num_shards" in capsys.readouterr().err
