import pytest

from bridge_ray.agent.choices import extract_choice

FOUR = {"A": "paralysis of the facial muscles.", "B": "loss of taste.", "C": "lacrimation.", "D": "all of the above"}
PUBMEDQA = {"A": "yes", "B": "no", "C": "maybe"}
BIOASQ = {"A": "yes", "B": "no"}


@pytest.mark.parametrize("answer", ["A", "a", "(A)", "A.", "A)", "Answer: A", "The answer is (A)", "Option A", " A "])
def test_letters(answer):
    assert extract_choice(answer, FOUR) == "A"


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("B. loss of taste", "B"),  # a labelled option: the letter decides
        ("(C) lacrimation", "C"),
        ("Paralysis of the facial muscles", "A"),  # the option text, normalised (case, punctuation)
        ("loss of taste", "B"),
        ("All of the above.", "D"),
    ],
)
def test_labelled_or_option_text(answer, letter):
    assert extract_choice(answer, FOUR) == letter


@pytest.mark.parametrize(
    ("answer", "options", "letter"),
    [
        ("yes", PUBMEDQA, "A"),
        ("No.", PUBMEDQA, "B"),
        ("Maybe, the evidence is mixed", PUBMEDQA, "C"),
        ("C", PUBMEDQA, "C"),
        ("yes, it does", BIOASQ, "A"),
        ("maybe", BIOASQ, None),  # not an option of BioASQ-Y/N
    ],
)
def test_yes_no_maybe(answer, options, letter):
    assert extract_choice(answer, options) == letter


@pytest.mark.parametrize("answer", [None, "", "E", "(E)", "facial nerve", "A lesion of the nerve", "yes"])
def test_nothing_named_is_none(answer):
    assert extract_choice(answer, FOUR) is None  # wrong, never a guess
