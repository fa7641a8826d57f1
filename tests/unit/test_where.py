"""The ``--where`` language without a database: tokens, grammar, precedence, errors, and that
nothing a user types reaches SQL text."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from ckptrepo.db.models import Commit
from ckptrepo.errors import UsageError
from ckptrepo.lineage import where
from ckptrepo.lineage.where import BoolOp, Compare, Name, Not, Value


def _sql(text: str) -> list[str]:
    """The expression compiled for both dialects, as SQL text (parameters left as placeholders)."""
    expr = where.compile_node(where.parse(text), text)
    q = select(Commit.id).where(expr)
    return [str(q.compile(dialect=d())) for d in (sqlite.dialect, postgresql.dialect)]


def test_tokens() -> None:
    kinds = [(t.kind, t.text) for t in where.tokenize("val_loss<=2.1 AND NOT(step!=-3e2)or t == 'a b'")]
    assert kinds == [
        ("name", "val_loss"), ("op", "<="), ("number", "2.1"), ("and", "AND"), ("not", "NOT"), ("lparen", "("),
        ("name", "step"), ("op", "!="), ("number", "-3e2"), ("rparen", ")"), ("or", "or"), ("name", "t"),
        ("op", "=="), ("string", "'a b'"), ("end", ""),
    ]  # fmt: skip
    dates = [t.text for t in where.tokenize("time >= 2026-03-01 and time < 2026-03-01T12:30:00+02:00")]
    assert dates[2] == "2026-03-01" and dates[6] == "2026-03-01T12:30:00+02:00"


@pytest.mark.parametrize("op", ["<", "<=", ">", ">=", "==", "!="])
def test_each_operator(op: str) -> None:
    node = where.parse(f"step {op} 10")
    assert node == Compare(op, Name("step", 0), Value(10, "number", 6 + len(op)), 5)
    for sql in _sql(f"step {op} 10"):
        assert f"commits.step {'=' if op == '==' else op} " in sql


def test_precedence_and_parentheses() -> None:
    node = where.parse("a < 1 or b < 2 and not c < 3")
    assert isinstance(node, BoolOp) and node.op == "or"
    assert isinstance(node.items[1], BoolOp) and node.items[1].op == "and"
    assert isinstance(node.items[1].items[1], Not)
    grouped = where.parse("(a < 1 or b < 2) and c < 3")
    assert isinstance(grouped, BoolOp) and grouped.op == "and" and isinstance(grouped.items[0], BoolOp)
    assert where.parse("NOT not a < 1") == Not(Not(Compare("<", Name("a", 8), Value(1, "number", 12), 10)))


def test_operands() -> None:
    node = where.parse("metric(\"val/loss top-1\") > 0.5")
    assert isinstance(node, Compare) and node.left == Name("val/loss top-1", 0, metric=True)
    node = where.parse("2.1 > val_loss")
    assert isinstance(node, Compare) and node.left == Value(2.1, "number", 0)
    node = where.parse(r"message == 'it\'s \"done\"'")
    assert isinstance(node, Compare) and node.right == Value("it's \"done\"", "string", 11)
    node = where.parse("step > 99999999999999999999")  # beyond int64: compared as a float, never an overflow
    assert isinstance(node, Compare) and isinstance(node.right, Value) and isinstance(node.right.value, float)


def test_time_values_are_utc_datetimes() -> None:
    for text, expected in [
        ("time >= 2026-03-01", datetime(2026, 3, 1, tzinfo=timezone.utc)),
        ("created_at < '2026-03-01T12:00+02:00'", datetime(2026, 3, 1, 10, tzinfo=timezone.utc)),
        ("time == \"2026-03-01T00:00:00Z\"", datetime(2026, 3, 1, tzinfo=timezone.utc)),
    ]:
        expr = where.compile_node(where.parse(text), text)
        params = select(Commit.id).where(expr).compile().params
        assert list(params.values()) == [expected]


def test_missing_values_are_false_not_null() -> None:
    metric_sql, step_sql = _sql("val_loss < 2")[0], _sql("not step > 1")[0]
    assert "EXISTS" in metric_sql and "metrics_1.name = " in metric_sql
    assert "commits.step IS NOT NULL" in step_sql


@pytest.mark.parametrize(
    "text",
    [
        "",
        "step",
        "step >",
        "step >= 1 and",
        "(step > 1",
        "step > 1)",
        "step = 1",
        "step <> 1",
        "step > 1 && epoch < 2",
        "step > 1 || epoch < 2",
        "!step > 1",
        "step > 1; DROP TABLE commits",
        "step = 1; DROP TABLE commits",
        "'x' OR 1=1 --",
        "' OR ''='",
        "step >= 1 -- comment",
        "step >= 1 /* c */",
        "1 < 2",
        "step < 'ten'",
        "branch > 3",
        "time > 5",
        "time > '2026-13-01'",
        "step > 2026-01-01",
        "val_loss < branch",
        "step > 1e",
        "step - 1 > 0",
        "message == 'unterminated",
        "metric(val_loss) > 1",
        "step > 1 step > 2",
        "(" * 60 + "step > 1" + ")" * 60,
        "not " * 60 + "step > 1",
        "step > 1 and " * 2000 + "step > 1",
        "step in (1, 2)",
        "val_loss < 2.1 and step >= 1000\x00",
    ],
)
def test_malformed_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as info:
        where.compile_node(where.parse(text), text)
    assert info.value.exit_code == 2
    assert "where expression" in info.value.message
    assert "\n" not in info.value.message


def test_mistakes_say_the_fix() -> None:
    with pytest.raises(UsageError, match="use == to compare"):
        where.parse("step = 1; DROP TABLE commits")
    with pytest.raises(UsageError, match="use != "):
        where.parse("step <> 1")
    with pytest.raises(UsageError, match="character 10"):
        where.parse("step > 1 && epoch < 2")


def test_user_text_never_reaches_sql() -> None:
    payload = "x'); DROP TABLE commits; --"
    for text in (f'branch == "{payload}"', f'metric("{payload}") > 1', f"message != {payload!r}"):
        for sql in _sql(text):
            assert "DROP" not in sql and payload not in sql
    expr = where.compile_node(where.parse(f'metric("{payload}") > 1'), "")
    assert payload in select(Commit.id).where(expr).compile().params.values()


def test_fields_are_known() -> None:
    assert {"step", "epoch", "time", "branch", "message", "author", "nonfinite"} <= set(where.FIELDS)
