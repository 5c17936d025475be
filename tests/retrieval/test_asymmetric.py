"""Asymmetric retrievers (MedCPT's and DPR's query / passage encoder pairs) on a tiny pair cut from the packaged
MiniLM: the passage model builds the index, the query model (+ LoRA) searches it, the manifest records both, and an
index of another pair, or of one model, is refused with the command that fixes it."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from retrieval_helpers import TableEmbedder, write_corpus
from transformers import AutoModel, AutoTokenizer, DPRConfig, DPRContextEncoder, DPRQuestionEncoder

from bridge_ray.cli import main
from bridge_ray.config import ConfigError, EncoderConfig, load_config
from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.model_paths import MINILM, resolve_model_path
from bridge_ray.retrieval.build import build_index
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.corpus import Document, PassageStore
from bridge_ray.retrieval.encoder import PassageEncoder, QueryEncoder, load_backbone
from bridge_ray.retrieval.manifest import IndexMismatchError, load_index_manifest
from bridge_ray.retrieval.shard import EMBEDDINGS_FILE
from bridge_ray.train.preflight import check_index

pytestmark = pytest.mark.slow  # each test loads a real (2-layer) encoder

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "jobs" / "configs"
QUESTIONS = ["Where was Ilsa Varen born?", "Who founded the Harrowgate Shipyard?"]
# The pair's settings besides its two models: [CLS], normalised, a prefix a side, short passages.
PAIR_SETTINGS = {"pooling": "cls", "normalize": True, "query_prefix": "query: ", "passage_prefix": "passage: ",
                 "max_query_length": 32, "max_passage_length": 64}


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """Two different 2-layer encoders cut from the packaged MiniLM (its layers 0-1 and 4-5), one tokenizer."""
    source = resolve_model_path(MINILM)
    tokenizer = AutoTokenizer.from_pretrained(source)
    dirs = {}
    for side, layers in (("query", slice(0, 2)), ("passage", slice(4, 6))):
        model = AutoModel.from_pretrained(source)
        model.encoder.layer = model.encoder.layer[layers]
        model.config.num_hidden_layers = 2
        dirs[side] = tmp_path_factory.mktemp(f"tiny-{side}")
        model.save_pretrained(dirs[side])
        tokenizer.save_pretrained(dirs[side])
    return str(dirs["query"]), str(dirs["passage"])


def pair_overrides(query: str, passage: str | None) -> list[str]:
    names = [f"retrieval.encoder.name={query}"] + ([f"retrieval.encoder.passage_name={passage}"] if passage else [])
    return names + [f"retrieval.encoder.{k}={json.dumps(v)}" for k, v in PAIR_SETTINGS.items()]


@pytest.fixture(scope="module")
def pair_index(tiny_pair, small_world, tmp_path_factory):
    """The small world's corpus indexed through the CLI with the pair (``--encoder`` + ``--passage-encoder``)."""
    query, passage = tiny_pair
    out = tmp_path_factory.mktemp("pair-index") / "index"
    settings = pair_overrides(query, None)[1:]
    args = ["build-index", "--corpus", str(small_world / "corpus.jsonl"), "--out", str(out), "--encoder", query,
            "--passage-encoder", passage, "--shards", "2", "--no-progress", "--device", "cpu", *settings]
    assert main(args) == 0
    return out


def test_the_passage_model_builds_the_index_and_the_manifest_records_both(tiny_pair, pair_index):
    query, passage = tiny_pair
    manifest = load_index_manifest(pair_index)
    assert manifest.encoder["model"] == query and manifest.encoder["passage_model"] == passage
    assert {k: manifest.encoder[k] for k in PAIR_SETTINGS} == PAIR_SETTINGS
    stored = np.concatenate([np.load(pair_index / f"shard_00{i}" / EMBEDDINGS_FILE) for i in range(2)])
    store = PassageStore(pair_index)
    docs = list(store.iter_documents(0, 5))
    store.close()
    spec = EncoderSpec(model=query, passage_model=passage, **PAIR_SETTINGS)
    expected = PassageEncoder(spec, device="cpu").embed_passages(docs)
    np.testing.assert_allclose(stored[:5], expected, atol=1e-5)
    # The query model embeds the same passages otherwise: the index is the passage model's.
    as_query_model = PassageEncoder(EncoderSpec(model=query, **PAIR_SETTINGS), device="cpu").embed_passages(docs)
    assert np.abs(as_query_model - expected).max() > 1e-2


def test_the_query_model_with_its_lora_searches_the_pair_index(tiny_pair, pair_index):
    query, passage = tiny_pair
    cfg = load_config(None, pair_overrides(query, passage)).retrieval
    encoder = QueryEncoder.from_config(cfg, init_seed=3)
    direct_tok, direct = load_backbone(query, torch.device("cpu"))
    batch = direct_tok(["query: " + q for q in QUESTIONS], padding=True, return_tensors="pt")
    with torch.no_grad():
        cls = torch.nn.functional.normalize(direct(**batch).last_hidden_state[:, 0], dim=-1)
    np.testing.assert_allclose(encoder.embed_queries(QUESTIONS, adapted=False), cls.numpy(), atol=1e-5)
    assert encoder.model.peft_config["default"].base_model_name_or_path == query  # the LoRA adapts the query model

    client = RetrieverClient.from_index(encoder, pair_index, num_candidates=5)
    with torch.no_grad():
        for p in encoder.trainable_parameters():
            p.normal_(0, 0.2)
    for r in client.retrieve(QUESTIONS):
        expected = encoder.encode_queries([r.query]).detach() @ client.doc_embeddings(r.doc_ids).T
        torch.testing.assert_close(expected[0], torch.tensor(r.scores), atol=1e-5, rtol=0)
    scores = encoder.encode_queries(QUESTIONS) @ client.doc_embeddings([0, 1, 2]).T
    scores.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.trainable_parameters())
    client.close()


def test_an_index_of_another_pair_is_refused_naming_the_key_and_the_build_command(tiny_pair, pair_index):
    query, passage = tiny_pair
    one_model = load_config(None, [*pair_overrides(query, None), f"retrieval.index.dir={pair_index}"])
    q, p, out = re.escape(query), re.escape(passage), re.escape(str(pair_index))
    with pytest.raises(IndexMismatchError, match=rf"passage_model: index has '{p}', configured '{q}'.*"
                       rf"retrieval.encoder.passage_name={p} .*build-index --corpus \S+ --out {out} --encoder {q} "
                       "--overwrite"):
        load_index_manifest(pair_index, one_model.retrieval.encoder.spec())
    swapped = load_config(None, [*pair_overrides(passage, query), f"retrieval.index.dir={pair_index}"])
    with pytest.raises(ConfigError, match=rf"model: index has '{q}', configured '{p}'.*build-index --corpus "
                       rf"\S+ --out {out} --encoder {p} --passage-encoder {q} --overwrite"):
        check_index(swapped)
    line, _ = check_index(load_config(None, [*pair_overrides(query, passage), f"retrieval.index.dir={pair_index}"]))
    assert f"encoder {query} + {passage}" in line
    corpus = load_index_manifest(pair_index).build["corpus"]["path"]
    rebuild = ["build-index", "--corpus", corpus, "--out", str(pair_index), "--encoder", query, "--no-progress",
               "--device", "cpu", *pair_overrides(query, None)[1:]]
    assert main(rebuild) == 2  # a taken --out: another configuration, named
    assert load_index_manifest(pair_index).encoder["passage_model"] == passage


def test_a_one_encoder_manifest_means_one_model_for_both_sides(tmp_path, minilm_spec, capsys):
    table = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    corpus = write_corpus(tmp_path / "corpus.jsonl", 6)
    old = minilm_spec.to_dict()
    assert "passage_model" not in old  # a symmetric spec writes what manifests and cache keys always held
    build_index(corpus, tmp_path / "old", TableEmbedder(table), encoder=old, dim=8, progress=False)
    for same in (minilm_spec, EncoderConfig(passage_name=MINILM).spec()):  # naming the model twice is one model
        assert load_index_manifest(tmp_path / "old", same).encoder == old
    pair = EncoderConfig(passage_name="intfloat/e5-base-v2").spec()
    with pytest.raises(IndexMismatchError, match=r"passage_model: index has 'all-MiniLM-L6-v2', configured "
                       r"'intfloat/e5-base-v2'.*--encoder all-MiniLM-L6-v2 --passage-encoder intfloat/e5-base-v2"):
        load_index_manifest(tmp_path / "old", pair)
    # Between two single models, `model` says it all (no second line for the passage side).
    e5 = EncoderConfig(name="intfloat/e5-base-v2").spec()
    assert not any(m.startswith("passage_model") for m in e5.index_mismatches(old))


def test_dpr_checkpoints_load_by_their_own_class(tmp_path):
    """AutoModel reads every DPR checkpoint as a question encoder: a context encoder's weights would be random."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MINILM))
    config = DPRConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64)
    torch.manual_seed(0)
    models = {"question": DPRQuestionEncoder(config), "ctx": DPRContextEncoder(config)}
    for name, model in models.items():
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    batch = tokenizer(QUESTIONS, padding=True, return_tensors="pt")
    spec = EncoderSpec(model=str(tmp_path / "question"), passage_model=str(tmp_path / "ctx"), pooling="cls",
                       normalize=False, query_prefix="", passage_prefix="", max_query_length=32, max_passage_length=32)
    with torch.no_grad():
        expected = {name: m.eval()(**batch).pooler_output for name, m in models.items()}
    docs = PassageEncoder(spec, device="cpu").embed_passages([Document(str(i), q) for i, q in enumerate(QUESTIONS)])
    np.testing.assert_allclose(docs, expected["ctx"].numpy(), atol=1e-5)
    query = QueryEncoder(spec, rank=2)  # LoRA on the BERT inside (query / key / value)
    np.testing.assert_allclose(query.embed_queries(QUESTIONS), expected["question"].numpy(), atol=1e-5)
    assert len(query.trainable_parameters()) == 2 * 3 * 2


def test_medrag_preset_pairs_medcpt_query_and_article_encoders():
    preset = REPO_CONFIGS / "qwen2.5-7b-medrag-eval.yaml"
    spec = load_config(preset).retrieval.encoder.spec()
    assert (spec.model, spec.passage_model) == ("ncbi/MedCPT-Query-Encoder", "ncbi/MedCPT-Article-Encoder")
    assert (spec.pooling, spec.normalize, spec.max_query_length, spec.max_passage_length) == ("cls", False, 64, 512)
    assert "build-index --config jobs/configs/qwen2.5-7b-medrag-eval.yaml" in preset.read_text()
    dpr = EncoderConfig(name="facebook/dpr-question_encoder-single-nq-base").spec()
    assert dpr.passage_encoder == "facebook/dpr-ctx_encoder-single-nq-base" and dpr.pooling == "cls"


def test_a_run_trained_with_a_pair_resumes_only_with_that_pair(tmp_path):
    from bridge_ray.checkpoint import CONFIG
    from bridge_ray.config import dump_config
    from bridge_ray.errors import InputError
    from bridge_ray.train.preflight import check_same_run

    pair = load_config(None, ["retrieval.encoder.passage_name=intfloat/e5-base-v2"])
    (tmp_path / CONFIG).write_text(dump_config(pair))
    check_same_run(tmp_path, pair, "--resume")
    with pytest.raises(InputError, match=r"another retriever encoder \(passage_model: checkpoint "
                       r"'intfloat/e5-base-v2', config None\)"):
        check_same_run(tmp_path, load_config(), "--resume")
    one_model = dump_config(load_config()).replace("    passage_name: null\n", "")  # a config from before pairs
    assert "passage_name" not in one_model
    (tmp_path / CONFIG).write_text(one_model)
    check_same_run(tmp_path, load_config(), "--resume")
    with pytest.raises(InputError, match=r"passage_model: checkpoint None, config 'intfloat/e5-base-v2'"):
        check_same_run(tmp_path, pair, "--resume")
