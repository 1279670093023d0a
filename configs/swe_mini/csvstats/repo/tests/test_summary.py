import pytest

from csvsummary import format_summary, summarize

PRICES = "item,price,qty\napple,1.5,10\npear,2.5,4\nplum,0.5,6\n"


def test_numeric_columns_are_summarized():
    assert summarize(PRICES) == {
        "price": {"count": 3, "min": 0.5, "max": 2.5, "mean": 1.5},
        "qty": {"count": 3, "min": 4.0, "max": 10.0, "mean": 20 / 3},
    }


def test_text_column_is_left_out():
    assert "item" not in summarize(PRICES)


def test_mixed_column_is_text():
    assert summarize("a\n1\nx\n") == {}


@pytest.mark.parametrize("text", ["", "a,b\n"], ids=["empty", "header only"])
def test_nothing_to_summarize(text):
    assert summarize(text) == {}


def test_quoted_numbers():
    assert summarize('n\n"1"\n"3"\n')["n"]["mean"] == 2.0


def test_format_summary():
    out = format_summary(summarize(PRICES)).splitlines()
    assert out[0] == "price  n=3  min=0.5  max=2.5  mean=1.5"
    assert out[1].startswith("qty    n=3  min=4  max=10")
