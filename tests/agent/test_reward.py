import pytest

from bridge_ray.agent.reward import (
    cover_exact_match,
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
)


def test_extract_answer_takes_the_last_complete_answer():
    assert extract_answer("<answer> Paris </answer> then <answer>Rome</answer>") == "Rome"
    assert extract_answer("<answer>multi\nline</answer>") == "multi\nline"
    assert extract_answer("<answer> Paris </answer> <answer> unfinished") == "Paris"
    assert extract_answer("no answer at all") is None
    assert extract_answer("<answer> open only") is None


def test_normalisation_is_squad_style():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_and_cover_match():
    assert exact_match("the Paris", ["paris", "Lutetia"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0
    assert cover_exact_match("Paris, France", ["Paris"]) == 1.0
    assert cover_exact_match("Rome", ["Paris"]) == 0.0
    assert exact_match("Paris", "paris") == 1.0  # a single golden answer as a string
    assert exact_match(None, ["Paris"]) == cover_exact_match(None, ["Paris"]) == f1_score(None, ["x"]) == 0.0


def test_f1_score():
    assert f1_score("William Shakespeare", ["Shakespeare"]) == pytest.approx(2 / 3)
    assert f1_score("the cat sat", ["a cat sat down", "dog"]) == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert f1_score("yes", ["no"]) == 0.0
    assert f1_score("yes it is", ["yes"]) == 0.0  # polar answers must match exactly
    assert f1_score("yes", ["yes"]) == 1.0
    assert f1_score("blue", ["red"]) == 0.0
