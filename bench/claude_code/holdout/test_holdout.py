"""Holdout tests: never shown to the session; they check the same behaviour on other inputs, so
a fix that special-cases the visible tests fails here."""
from textstats.money import format_cents, parse_amount
from textstats.words import top_words, word_count


def test_holdout_words():
    assert word_count("alpha\n\n beta\t\tgamma  delta\r\nepsilon") == 5
    assert top_words("x y z y z z w", 3) == [("z", 3), ("y", 2), ("w", 1)]


def test_holdout_money_parse():
    assert parse_amount("$12,345,678.09") == 1234567809
    assert parse_amount("7") == 700


def test_holdout_money_format():
    assert format_cents(1234567809) == "$12,345,678.09"
    assert format_cents(3) == "$0.03"
