"""secret_weakness (synapse_repl/security.py): what a bearer secret must be to resist guessing.
Random secrets of the usual generators pass; short ones, patterns repeated (with something
added), a small alphabet for the length and few distinct characters are refused, and the
reason never contains the secret. (The production start-up refusal: test_security.py.)"""
from __future__ import annotations

import random
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse_repl.security import MIN_SECRET_LENGTH, alphabet, secret_weakness

URL_SAFE = string.ascii_letters + string.digits + "-_"


@pytest.mark.parametrize("chars, length", [
    (URL_SAFE, 32),  # secrets.token_urlsafe(24)
    (URL_SAFE, 43),  # secrets.token_urlsafe(32), what the docs and the messages say
    ("0123456789abcdef", 32),  # secrets.token_hex(16): 128 bits
    ("0123456789ABCDEF", 32),
    (string.digits, 39),  # 130 bits of digits
    (string.ascii_lowercase, 32),
    (string.ascii_uppercase + string.digits, 32),
    (string.printable[:94], 32),
])
def test_random_secrets_of_enough_bits_pass(chars, length):
    rng = random.Random(f"{chars}{length}")  # seeded: the same 2,000 secrets every run
    for _ in range(2_000):
        value = "".join(rng.choice(chars) for _ in range(length))
        assert secret_weakness(value) is None, value


@pytest.mark.parametrize("value, reason", [
    ("a", "is 1 characters long, shorter than 32"),
    ("a" * 32, "repeats a pattern"),
    ("ab" * 16, "repeats a pattern"),
    ("0123456789abcdef" * 2, "repeats a pattern"),
    ("1234567890" * 3 + "12x", "repeats a pattern"),  # a pattern with something added
    ("a" * 31 + "b", "repeats a pattern"),
    ("1" * 20 + "2" * 20, "repeats a pattern"),
    ("kX3p9QzR7mVt2LwB8nYc" + "a" * 26, "repeats a pattern"),  # a good start, then a run
    ("39825979190748337887623286012904", "is 32 digits (at most 106 bits; 128 needed: 39 of them"),
    ("abcdefghijklmnopqrstuvwxyz012345", None),
])
def test_guessable_secrets_are_named(value, reason):
    problem = secret_weakness(value)
    if reason is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(reason), problem


def test_few_distinct_characters_are_named():
    # 32 of a, b, c holding every 3-character run of them (a de Bruijn sequence): no pattern,
    # the alphabet (lowercase) looks large, but three letters make about 51 bits
    value = "aaabaacabbabcacbaccbbbcbcccaabcb"
    assert secret_weakness(value).startswith("repeats its characters (3 distinct in 32: about "), value


def test_the_alphabet_is_the_smallest_usual_one():
    assert alphabet("0123") == ("digits", 10)
    assert alphabet("00ff") == ("hex digits", 16) == alphabet("00FF")
    assert alphabet("00fF") == ("lowercase letters and uppercase letters and digits", 62)
    assert alphabet("a-Z") == ("lowercase letters and uppercase letters and other characters", 85)


@given(st.text(max_size=MIN_SECRET_LENGTH - 1))
def test_anything_shorter_than_the_minimum_is_weak(value):
    assert secret_weakness(value).startswith(f"is {len(value)} characters long")


@given(st.text(min_size=1, max_size=10), st.integers(min_value=4, max_value=40))
def test_a_short_run_repeated_is_weak(run, times):
    value = run * times
    if len(value) >= MIN_SECRET_LENGTH:
        assert secret_weakness(value) is not None


@given(st.text(min_size=MIN_SECRET_LENGTH, max_size=80))
def test_the_reason_never_contains_the_secret(value):
    problem = secret_weakness(value)
    assert problem is None or value not in problem
