import sys

sys.path.insert(0, "/app")

from fizzbuzz import fizzbuzz  # noqa: E402


def test_multiples():
    assert [fizzbuzz(i) for i in (3, 5, 15, 30, 7)] == ["Fizz", "Buzz", "FizzBuzz", "FizzBuzz", "7"]
