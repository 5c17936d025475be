"""``bench replay``: the variant syntax and a real collection and replay at the smallest size (the
tiny Gemma warmed up to search, ``searching`` in conftest.py, over the small world's MiniLM index)."""

import json

import pytest
from job_fixtures import LOCAL_CPU, SMALL_JOB, job_config

from bridge_ray.bench.replay import parse_adapters, parse_variants
from bridge_ray.cli import main
from bridge_ray.errors import InputError
from bridge_ray.retrieval.encoder import QueryEncoder


def test_variants_become_retriever_overrides_and_bad_ones_name_themselves():
    assert parse_variants([]) == [("config", [])]
    assert parse_variants(["small:lr=3e-4,inner_steps=2", "kl:kl_coef=1"]) == [
        ("small", ["algorithm.retriever.lr=3e-4", "algorithm.retriever.inner_steps=2"]),
        ("kl", ["algorithm.retriever.kl_coef=1"]),
    ]
    for bad, message in (("lr=3e-4", "NAME:KEY"), ("a:lr", "'lr' is not KEY=VALUE")):
        with pytest.raises(InputError, match=message):
            parse_variants([bad])
    with pytest.raises(InputError, match="used twice"):
        parse_variants(["a:lr=1", "a:lr=2"])


def test_adapters_name_a_peft_folder_or_a_checkpoint_holding_one(tmp_path):
    adapter = tmp_path / "ckpt" / "retriever_adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    assert parse_adapters([f"a={tmp_path / 'ckpt'}", f"b={adapter}"]) == [("a", adapter), ("b", adapter)]
    with pytest.raises(InputError, match="NAME=DIR"):
        parse_adapters([str(adapter)])
    with pytest.raises(InputError, match=r"no adapter_config\.json"):
        parse_adapters([f"c={tmp_path}"])


def test_a_variant_cannot_change_what_the_turns_were_collected_with(tmp_path, capsys):
    args = ["bench", "replay", "--rows", str(tmp_path / "rows")]
    assert main([*args, "--variant", "k:num_candidates=4"]) == 2
    assert "algorithm.retriever.num_candidates is fixed by the collection" in capsys.readouterr().err
    assert main([*args, "--seeds", "0,a"]) == 2  # refused while the command line is parsed
    assert "argument --seeds: expected a whole number, not 'a'" in capsys.readouterr().err
    assert main([*args, "--variant", "k:no_such_key=1"]) == 2 and "no_such_key" in capsys.readouterr().err
    assert not (tmp_path / "rows").exists()  # refused before anything was collected


@pytest.mark.slow
def test_collects_once_and_replays_the_same_figures(searching, small_world, tmp_path, capsys):
    """Two variants × two seeds over one collected batch; a second call reuses the rows and gives the same figures;
    a call with other collection settings is refused."""
    _, overrides = searching
    rows, out = tmp_path / "rows", tmp_path / "replay.json"
    args = ["bench", "replay", "--config", str(LOCAL_CPU), "--questions", "1", "--dev-questions", "3",
            "--probe", str(small_world / "dev.jsonl"), "--rows", str(rows), "--seeds", "0,1",
            "--variant", "paper:lr=1e-5", "--variant", "large:lr=0.05,inner_steps=4,kl_coef=0.5",
            *SMALL_JOB, *overrides, "rollout.questions_per_batch=1", "optim.mini_batch_size=1"]
    assert main([*args, "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert (figures["questions"], figures["probe_questions"], figures["seeds"]) == (1, 3, [0, 1])
    assert figures["turns"] == len((rows / "turns.jsonl").read_text().splitlines()) > 0
    probe = [json.loads(line) for line in (rows / "probe.jsonl").read_text().splitlines()]
    assert len(probe) == 3 and all(q["gold"] for q in probe)
    paper, large = figures["variants"]
    assert (paper["name"], large["retriever"]["kl_coef"], large["retriever"]["inner_steps"]) == ("paper", 0.5, 4)
    for variant in (paper, large):
        by_seed = variant["recall_per_round_by_seed"]
        assert len(by_seed) == 2 and all(len(curve) == 2 for curve in by_seed)  # the frozen retriever, 1 round
        assert by_seed[0][0] == by_seed[1][0] == paper["recall_per_round_by_seed"][0][0]  # round 0 is frozen
        assert all(0 <= r <= 100 for curve in by_seed for r in curve)
    assert set(figures["signal"]) == {"turns_gold_in_k", "posterior_gold_first", "uniform_weight_on_gold_first",
                                      "evidence_weight_on_gold_first"}

    turns_written = (rows / "turns.jsonl").stat().st_mtime_ns
    again = tmp_path / "again.json"
    assert main([*args, "--out", str(again)]) == 0
    assert (rows / "turns.jsonl").stat().st_mtime_ns == turns_written  # not collected twice
    assert json.loads(again.read_text()) == figures  # one seed, one machine: the same figures

    # a saved adapter on the same probe: a fresh one (B = 0) is the frozen retriever, to the bit
    fresh = tmp_path / "fresh-adapter"
    QueryEncoder.from_config(job_config(tmp_path / "run", *overrides).retrieval).save_adapter(fresh)
    probed = tmp_path / "probed.json"
    assert main([*args[:args.index("--variant")], *args[args.index("--variant") + 4:], "--adapter", f"fresh={fresh}",
                 "--out", str(probed)]) == 0
    adapters = json.loads(probed.read_text())
    assert adapters["variants"] == [] and not probed.with_suffix(".png").exists()
    (row,) = adapters["adapters"]
    assert (row["name"], row["diff_recall"]) == ("fresh", 0.0)
    assert row["recall"] == pytest.approx(paper["recall_per_round"][0])

    other = [*args[:5], "2", *args[6:]]  # two questions where one was collected
    assert other[4] == "--questions" and main(other) == 2
    assert "collected with other settings" in capsys.readouterr().err
