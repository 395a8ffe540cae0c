"""driver/models.py: prices and their precedence, the --model list, the ensemble's draws, the cost-aware bandit,
the dollar cap and the Role every LLM call goes through (pure logic; no server, no run)."""
from __future__ import annotations

import math
import random
import threading
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings, strategies as st

from driver import models
from driver.models import Price

# ----------------------------------------------------------------------------- prices


def test_the_shipped_table_is_dated_and_every_price_is_a_number():
    date, table = models.read_prices(models.PRICES_FILE.read_text())
    assert len(date) == 10 and date[4] == "-" and date[7] == "-"
    assert "gemini-2.5-pro" in table and "gpt-5" in table and "claude-sonnet-4-5" in table
    assert all(p.input >= 0 and p.output >= 0 and p.output >= p.input for p in table.values())
    assert table["gemini-2.5-pro"] == Price(1.25, 10.0)


@pytest.mark.parametrize("text, where", [("a 1 2\nb 1\n", "line 2"), ("a 1 x\n", "line 1"),
                                         ("a 1 2\na 3 4\n", "line 2"), ("a -1 2\n", "line 1"),
                                         ("a 1 nan\n", "line 1")])
def test_a_broken_table_names_its_line(text, where):
    with pytest.raises(ValueError, match=where):
        models.read_prices(text)


def test_price_options():
    assert models.parse_price("gpt-5=1.25/10") == ("gpt-5", Price(1.25, 10))
    assert models.parse_price("qwen2.5-coder:32b=0/0") == ("qwen2.5-coder:32b", Price(0, 0))
    assert models.parse_price("a=b=1/2") == ("a=b", Price(1, 2))
    for bad in ("gpt-5", "gpt-5=1", "=1/2", "gpt-5=1/2/3", "gpt-5=x/1", "gpt-5=-1/1", "gpt-5=1/inf"):
        with pytest.raises(ValueError):
            models.parse_price(bad)


@given(st.text(max_size=30))
def test_any_price_text_parses_or_says_why(text):
    try:
        name, price = models.parse_price(text)
    except ValueError as e:
        assert str(e)
    else:
        assert name and price.input >= 0 and price.output >= 0


def test_which_price_applies():
    table = {"gpt-5": Price(1.25, 10), "claude-sonnet-4-5": Price(3, 15)}
    given = {"gpt-5": Price(2, 20), "mine": Price(0, 0)}
    assert models.price_of("gpt-5", None, table, given) == Price(2, 20)            # --price wins
    assert models.price_of("gpt-5", "http://localhost:8000/v1", table, given) == Price(2, 20)
    assert models.price_of("gpt-5", "http://localhost:8000/v1", table, {}) == Price(0, 0)   # local: free
    assert models.price_of("gpt-5-2025-08-07", None, table, {}) == Price(1.25, 10)   # a dated snapshot
    assert models.price_of("claude-sonnet-4-5-20250929", None, table, {}) == Price(3, 15)
    assert models.price_of("gpt-5-mini", None, table, {}) is None                 # no prefix guessing
    assert models.price_of("openai/gpt-5", "https://openrouter.ai/api/v1", table, {}) is None
    assert models.price_of("mine", "https://example.com/v1", table, given) == Price(0, 0)


@pytest.mark.parametrize("url, local", [("http://localhost:8000/v1", True), ("http://127.0.0.1:9/v1", True),
                                        ("http://127.3.2.1/v1", True), ("http://[::1]:8000/v1", True),
                                        ("http://LOCALHOST/v1", True), ("localhost:11434/v1", True),
                                        ("http://gpu.localhost/v1", True), ("https://api.openai.com/v1", False),
                                        ("http://10.0.0.5:8000/v1", False), ("http://localhost.example.com", False)])
def test_local_servers(url, local):
    assert models.is_local(url) is local


def test_cost_is_per_million_tokens():
    assert Price(1.25, 10).cost(1_000_000, 0) == 1.25
    assert math.isclose(Price(1.25, 10).cost(2_000, 500), 0.0025 + 0.005)


# ----------------------------------------------------------------------------- the --model list

def test_model_lists():
    assert models.parse_models("gpt-5") == {"gpt-5": 1.0}
    assert models.parse_models("a, b,c") == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert models.parse_models("a=0.7,b=0.3") == {"a": 0.7, "b": 0.3}
    assert models.parse_models("qwen2.5-coder:32b=2,openai/gpt-5=1") == {"qwen2.5-coder:32b": 2.0, "openai/gpt-5": 1.0}
    for bad, why in (("a,,b", "without a name"), ("a,a", "twice"), ("a=0.7,b", "every model a weight"),
                     ("a=0,b=1", "> 0"), ("a=x,b=1", "not a number"), ("a=inf,b=1", "> 0"), ("=1", "without")):
        with pytest.raises(ValueError, match=why):
            models.parse_models(bad)


@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9.:/-]{0,12}", fullmatch=True),
                       st.floats(0.01, 100, allow_nan=False), min_size=1, max_size=5))
def test_a_weighted_list_round_trips(weights):
    text = ",".join(f"{m}={w!r}" for m, w in weights.items())
    assert models.parse_models(text) == weights


# ----------------------------------------------------------------------------- the ensemble

def test_the_ensembles_draws_follow_the_weights_and_the_seed():
    choice = models.Weighted({"a": 0.7, "b": 0.2, "c": 0.1})
    draws = [choice.choose(random.Random(f"x{k}")) for k in range(20_000)]
    for m, w in (("a", 0.7), ("b", 0.2), ("c", 0.1)):
        share = draws.count(m) / len(draws)
        assert abs(share - w) < 4 * math.sqrt(w * (1 - w) / len(draws)), (m, share)
    rng1, rng2 = random.Random(5), random.Random(5)
    assert [choice.choose(rng1) for _ in range(50)] == [choice.choose(rng2) for _ in range(50)]


def test_one_model_draws_nothing():
    rng = random.Random(1)
    state = rng.getstate()
    assert models.Weighted({"a": 1.0}).choose(rng) == "a" and models.CostUCB(["a"]).choose(rng) == "a"
    assert rng.getstate() == state


# ----------------------------------------------------------------------------- the bandit

def _simulate(p_improve: dict, cost: dict, rounds=30, islands=2, calls=3, seed=0) -> list[list[str]]:
    """Rounds of islands whose generations make `calls` main-role calls; the last call's model writes the
    candidate, which improves (gain 0.1) with that model's probability; statistics change between rounds."""
    choice = models.CostUCB(list(p_improve))
    rngs = [random.Random(f"{seed}:{i}") for i in range(islands)]
    env = random.Random(f"env{seed}")
    out = []
    for _ in range(rounds):
        gens = []
        for i in range(islands):
            picks = [choice.choose(rngs[i]) for _ in range(calls)]
            gens.append((picks, 0.1 if env.random() < p_improve[picks[-1]] else 0.0))
        for picks, gain in gens:
            for m in set(picks):
                k = picks.count(m)
                choice.update(m, k, cost[m] * k, gain * k / len(picks))
        out.append([m for picks, _ in gens for m in picks])
    return out


def _late_share(rounds: list[list[str]], model: str) -> float:
    late = [m for r in rounds[len(rounds) // 2:] for m in r]
    return late.count(model) / len(late)


@pytest.mark.parametrize("p_improve, cost, better", [
    ({"cheap": 0.25, "strong": 0.9}, {"cheap": 0.002, "strong": 0.02}, "cheap"),    # worse, but 2.8x the value
    ({"cheap": 0.05, "strong": 0.9}, {"cheap": 0.002, "strong": 0.02}, "strong"),   # cheaper, but 1.8x less value
    ({"a": 0.3, "b": 0.6}, {"a": 0.01, "b": 0.01}, "b"),                              # same price: the better one
    ({"local": 0.3, "paid": 0.6}, {"local": 0.0, "paid": 0.01}, "local"),           # free and useful
    ({"local": 0.02, "paid": 0.6}, {"local": 0.0, "paid": 0.01}, "paid"),           # free, nearly useless
])
def test_the_bandit_moves_to_the_better_value(p_improve, cost, better):
    shares = [_late_share(_simulate(p_improve, cost, seed=s), better) for s in range(10)]
    assert sum(x > 0.6 for x in shares) >= 8, shares
    assert sum(shares) / len(shares) > 0.7, shares


def test_the_bandit_tries_every_model_first_and_keeps_trying():
    rounds = _simulate({"a": 0.0, "b": 0.9}, {"a": 0.01, "b": 0.01}, rounds=200)
    assert {"a", "b"} <= set(rounds[0] + rounds[1])
    tried = [k for k, r in enumerate(rounds) if "a" in r]
    assert tried[-1] > 100   # UCB's bonus: a model that never gained is still tried, ever more rarely


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.one_of(st.just(0.0), st.floats(1e-6, 1)), st.floats(0, 0.3)),
                min_size=2, max_size=12), st.floats(0.01, 1000))
@example([(1, 0.0, 5e-324), (1, 0.5, 0.0)], 2.0)   # a gain near the smallest float: divided to zero once
def test_the_bandits_choice_does_not_change_when_every_price_is_scaled(history, k):
    a, b = models.CostUCB(["x", "y"]), models.CostUCB(["x", "y"])
    for n, (calls, usd, gain) in enumerate(history):
        m = "xy"[n % 2]
        a.update(m, calls, usd, gain)
        b.update(m, calls, usd * k, gain)
    ia, ib = a.index(), b.index()
    assert all(math.isclose(ia[m], ib[m], rel_tol=1e-9, abs_tol=1e-9) for m in ia)
    assert a.choose(random.Random(3)) == b.choose(random.Random(3))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.floats(0.001, 1), st.floats(0.01, 0.5), st.floats(1.5, 10))
def test_more_gain_per_dollar_at_equal_calls_is_never_ranked_lower(calls, usd, gain, factor):
    choice = models.CostUCB(["x", "y"])
    choice.update("x", calls, usd, gain)
    choice.update("y", calls, usd * factor, gain)       # the same gain for more money
    assert choice.values()["x"] > choice.values()["y"]
    assert choice.choose(random.Random(0)) == "x"


def test_a_changed_model_list_keeps_the_models_still_present():
    old = models.CostUCB(["a", "b"])
    old.update("a", 6, 0.3, 0.2)
    old.update("b", 3, 0.9, 0.0)
    new = models.CostUCB(["a", "c"])
    new.restore(old.to_dict())
    assert new.stats == {"a": {"calls": 6, "usd": 0.3, "gain": 0.2}, "c": {"calls": 0, "usd": 0.0, "gain": 0.0}}
    assert new.choose(random.Random(0)) == "c"   # the new model starts fresh, so it is tried first


# ----------------------------------------------------------------------------- the cap

def test_the_cap_stops_new_calls_exactly():
    # price 1/1 per million; 3,000 characters at 3 per token = 1,000 input tokens; output bounded at 1,000:
    # each call is estimated and costs exactly $0.002, so a $0.01 cap allows exactly 5 calls
    spend = models.Spend({"m": Price(1, 1)}, cap=0.01, max_output_tokens=1000)
    made = 0
    with pytest.raises(models.BudgetReached, match=r"\$0.01 of \$0.01 spent"):
        while True:
            est = spend.reserve("m", "x" * 3000)
            assert math.isclose(est, 0.002)
            spend.settle("m", est, 3000, {"input": 1000, "output": 1000}, island=0)
            made += 1
    assert made == 5 and math.isclose(spend.total, 0.01) and spend.total <= 0.01 + 1e-12
    with pytest.raises(models.BudgetReached):   # latched: no later call either, however small
        spend.reserve("m", "")
    assert spend.stop_reason().startswith("dollar budget reached")


@settings(max_examples=80, deadline=None)
@given(st.floats(0.001, 1), st.lists(st.tuples(st.integers(0, 20_000), st.floats(0, 1)), min_size=1, max_size=40),
       st.integers(1, 4))
def test_the_spend_never_passes_the_cap_when_calls_cost_at_most_their_estimate(cap, calls, in_flight):
    """Calls reserved `in_flight` at a time (as islands do), each costing at most its estimate (its prompt at
    the model's 3 characters a token, a reply up to the longest): the paid total never passes the cap, and a
    call is refused exactly when its estimate does not fit. (Prompts billed at fewer tokens than that once
    taught the estimate more characters a token, and a later prompt then cost more than its estimate.)"""
    spend = models.Spend({"m": Price(2, 8)}, max_output_tokens=2000)
    spend.settle("m", 0.0, 3000, {"input": 1000, "output": 10})   # the model's tokens per character: 1/3
    spend.cap = cap = spend.total + cap
    flight = []
    for chars, fraction in calls:
        if len(flight) >= in_flight:
            est, c, f = flight.pop(0)
            spend.settle("m", est, c, {"input": int(c / 3), "output": int(2000 * f)}, island=0)
        before = spend.total + spend.reserved
        est = spend.estimate("m", chars)
        try:
            flight.append((spend.reserve("m", "x" * chars), chars, fraction))
        except models.BudgetReached:
            assert before + est > cap
            break
        assert before + est <= cap + 1e-12
    for est, c, f in flight:
        spend.settle("m", est, c, {"input": int(c / 3), "output": int(2000 * f)}, island=0)
    assert spend.total <= cap + 1e-12 and spend.reserved == pytest.approx(0, abs=1e-12)


def test_the_estimate_learns_from_the_models_replies():
    spend = models.Spend({"m": Price(1, 1)})
    assert spend.estimate("m", 3000) == Price(1, 1).cost(1000, models.OUTPUT_ESTIMATE)   # 3 chars a token
    spend.settle("m", 0, 40, {"input": 10, "output": 1})                  # the probe: says nothing of output
    assert spend.estimate("m", 4000) == Price(1, 1).cost(1000, models.OUTPUT_ESTIMATE)
    spend.settle("m", 0, 7960, {"input": 1990, "output": 600}, island=0)
    assert spend.estimate("m", 4000) == Price(1, 1).cost(1000, 600)       # 4 chars a token, longest reply
    assert models.Spend({"m": None}).estimate("m", 100) is None


def test_the_next_round_is_forecast_from_the_last_rounds():
    spend = models.Spend({"m": Price(1, 1)}, cap=1.0)
    for cost in (0.1, 0.2, 0.3):
        spend.round_started()
        spend.settle("m", 0, 1, {"input": int(cost * 1e6), "output": 0}, island=0)
        spend.round_finished()
    assert math.isclose(spend.forecast(), 0.2) and spend.stop_reason() == ""
    spend.round_started()
    spend.settle("m", 0, 1, {"input": 250_000, "output": 0}, island=0)   # 0.85 paid + 0.2 expected > 1
    spend.round_finished()
    assert "a round costs about" in spend.stop_reason()
    again = models.Spend({"m": Price(1, 1)}, cap=2.0)
    again.restore(spend.to_dict())
    assert math.isclose(again.total, 0.85) and again.stop_reason() == ""   # a higher cap goes on


# ----------------------------------------------------------------------------- the Role

class FakeClient:
    """A callable that answers with its name and reports `tokens` in its thread's `last` reply."""

    def __init__(self, name: str, tokens: tuple[int, int] = (100, 10), fail: bool = False):
        self.name, self.tokens, self.fail = name, tokens, fail
        self._local = threading.local()

    def __call__(self, prompt: str) -> str:
        self._local.last = SimpleNamespace(usage={"input": self.tokens[0], "output": self.tokens[1],
                                                  "reasoning": 0, "total": sum(self.tokens)})
        if self.fail:
            raise RuntimeError("HTTP 500")
        return self.name

    @property
    def last(self):
        return getattr(self._local, "last", None)


def _role(choice=None, cap=None, seed=0):
    clients = {"a": FakeClient("a", (1000, 100)), "b": FakeClient("b", (1000, 100))}
    spend = models.Spend({"a": Price(1, 2), "b": Price(10, 20)}, cap=cap)
    return models.Role("main", clients, choice or models.Weighted({"a": 1.0, "b": 1.0}), spend, seed)


def test_each_call_goes_to_a_drawn_model_and_is_counted():
    role = _role()
    view = role.for_island(0)
    answers = [view("p" * 100) for _ in range(40)]
    assert set(answers) == {"a", "b"}
    assert role.usage["calls"] == 40 and role.usage["prompt_tokens"] == 40_000
    assert role.model == answers[-1]
    assert role.last_usd == Price(1, 2).cost(1000, 100) if answers[-1] == "a" else Price(10, 20).cost(1000, 100)
    record = role.credit(0, gain=0.5)
    assert record["models"] == {"a": answers.count("a"), "b": answers.count("b")}
    assert math.isclose(record["usd"], role.spend.total)
    assert math.isclose(sum(s["gain"] for s in role.choice.stats.values()), 0.5)   # shared by the calls
    assert role.credit(0, 0.0) == {"models": {}, "usd": 0}                          # taken once


def test_the_draws_are_per_island_seeded_and_survive_a_checkpoint():
    whole, first = _role(seed=3), _role(seed=3)
    expect = [whole.for_island(i)("p") for _ in range(10) for i in (0, 1)]
    got = [first.for_island(i)("p") for _ in range(5) for i in (0, 1)]
    resumed = _role(seed=3)
    resumed.restore(first.state())
    got += [resumed.for_island(i)("p") for _ in range(5) for i in (0, 1)]
    assert got == expect


def test_a_refused_call_sends_nothing_and_a_failed_one_is_still_paid():
    role = _role(cap=0.0005)
    with pytest.raises(models.BudgetReached):
        role.for_island(0)("p")
    assert role.usage["calls"] == 0 and role.spend.total == 0
    failing = models.Role("main", {"a": FakeClient("a", (1000, 0), fail=True)}, models.Weighted({"a": 1}),
                          models.Spend({"a": Price(1, 1)}))
    with pytest.raises(RuntimeError):
        failing.for_island(0)("p")
    assert failing.usage["failures"] == 1 and math.isclose(failing.spend.total, 0.001)


def test_the_probe_reaches_every_model_with_its_clients_settings():
    role = _role()
    role.clients["a"].base_url = "http://127.0.0.1:9/v1"
    ones = role.each()
    assert [one.model for one in ones] == ["a", "b"] and ones[0].base_url == "http://127.0.0.1:9/v1"
    assert [one("p") for one in ones] == ["a", "b"]
    assert role.spend.pending == {}   # a probe is no island's call
    role.for_island(0)("q")
    assert role.usage["calls"] == 3 and role.usage["probes"] == 2   # the reports say how many were probes


def test_a_round_cut_short_is_not_begun_again_under_the_same_cap():
    spend = models.Spend({"m": Price(1, 1)}, cap=0.01)
    spend.round_started()
    spend.settle("m", 0, 15000, {"input": 5000, "output": 0}, island=0)   # $0.005 paid in the round
    with pytest.raises(models.BudgetReached, match=r"--max-output-tokens bounds it"):
        spend.reserve("m", "x" * 3000)                                     # 1,000 in + 4,096 out: $0.0051
    same = models.Spend({"m": Price(1, 1)}, cap=0.01)
    same.restore(spend.to_dict())
    assert same.forecast() == pytest.approx(0.005 + Price(1, 1).cost(1000, models.OUTPUT_ESTIMATE))
    assert same.stop_reason().startswith("dollar budget reached: $0.005 of $0.01 spent")
    for changed in (models.Spend({"m": Price(1, 1)}, cap=0.02),               # a higher cap, or
                    models.Spend({"m": Price(1, 1)}, cap=0.01, max_output_tokens=500)):   # a bounded output
        changed.restore(spend.to_dict())
        assert changed.forecast() == 0 and changed.stop_reason() == ""   # may go on: the guard still holds
