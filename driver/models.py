"""Several LLMs for one role, what each call costs, and a dollar cap: the ensemble, the cost-aware bandit
and the spend accounting behind --model a,b, --model-choice, --price and --budget-usd.

    date, table = read_prices(PRICES_FILE.read_text())   # prices.txt: {model: Price}, US$ per million tokens
    price = price_of(model, base_url, table, given)      # --price wins, a local server is free, else the table
    weights = parse_models("a=0.7,b=0.3")                 # {"a": 0.7, "b": 0.3}; "a,b" gives equal weights
    choice = Weighted(weights) or CostUCB(names)          # choose(rng) per call, update(...) per generation
    spend = Spend(prices, cap_usd)                        # reserve before each call, settle after; the ledger
    main = Role("main", clients, choice, spend, seed)     # the LLM HCM calls: one model per call, in the cap
    record = main.credit(island, gain)                    # a generation's end: its calls, models and cost

The paper pairs a strong model with a cheaper one by role (Gemini 2.5 Pro for ideas and code, Flash for the
rest). This module lets the main role hold several models. On every call, `Weighted` draws a model with
probability proportional to its weight; `CostUCB` takes the model with the highest upper confidence bound
on improvement per dollar:

    model m's statistics: n_m main-role calls, c_m dollars, g_m gain, where a generation's gain
        g = max(0, 1 - s_child / s_parent)          (scores are runtimes; no candidate, or a failed one: 0)
    is shared equally among that generation's main-role calls; a free model's calls count as a tenth of
    the cheapest paid model's mean call each (c_m >= 0.1 n_m min_k c_k/n_k), so free is not infinitely
    good; over all models g_bar = sum g / sum n and c_bar = sum c / sum n are the means per call;
    value   v_m = (g_m + K g_bar) / (c_m + K c_bar)     gain per dollar, shrunk toward the all-model value
                                                    with the weight of K = 6 calls (two generations' main
                                                    calls); when every call was free: gain per call,
                                                    (g_m + K g_bar) / (n_m + K)
    index   U_m = v_m / max_k v_k + sqrt(2 ln N / n_m)     N = sum of n_m: UCB1's exploration bonus
    choice  a model never called first (drawn among them), else argmax U_m (ties drawn)

The value is normalised by the best one, so the exploitation term lies in [0, 1] as UCB1 assumes and the
choice does not change when every price is scaled. Without the shrinking, a model whose first calls happened
to gain nothing is valued 0 and UCB1 almost never tries it again; shrinking toward the mean value (not the
mean gain, which would flatter a cheap model) lets a few calls neither condemn nor crown a model. Paid models
are compared exactly per dollar; a free model is preferred while it gains at least a tenth of what the
cheapest paid model gains per call. Statistics change only between rounds, in island order, and each island
draws with its own seeded generator: with a deterministic LLM a run makes the same choices again, across a
resume too. (Improvements get rarer as a search goes on, so a model tried early looks a little better than
it is; UCB's bonus keeps trying the others.)

The cap: a call starts only if the dollars paid so far, plus what the calls in flight may cost, plus this
call's estimate stay within it. The estimate prices the prompt at the model's measured tokens per character
(3 characters per token until it has answered) and, for the output, --max-output-tokens when set (a true
bound), else the longest output the model has given in the search (4,096 tokens before its first reply;
1,024 for the probe before a run, which asks for one word). Once a call is refused every
later one is too: BudgetReached, raised before anything is sent. Standard library only.
"""
from __future__ import annotations

import ipaddress
import math
import random
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

PRICES_FILE = Path(__file__).with_name("prices.txt")
CHARS_PER_TOKEN = 3          # the input estimate before a model has answered
OUTPUT_ESTIMATE = 4096       # the output estimate without --max-output-tokens, before the first reply
PROBE_OUTPUT = 1024          # ... and for the probe, asked for one word (a reasoning model thinks first)
PRIOR_CALLS = 6              # K: the weight, in calls, of the all-model value in a model's value
FREE_CALL = 0.1              # a free call counts as a tenth of the cheapest paid model's mean call
RECENT_ROUNDS = 5            # the next round is forecast from the mean cost of the last rounds
CHOICES = ("weights", "ucb")


# ----------------------------------------------------------------------------- prices

@dataclass(frozen=True)
class Price:
    input: float     # US dollars per million input tokens
    output: float    # US dollars per million output tokens (reasoning tokens included)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1e6

    def __str__(self) -> str:
        return f"{self.input:g}/{self.output:g}"


def read_prices(text: str) -> tuple[str, dict[str, Price]]:
    """The date line and the table of prices.txt: `MODEL INPUT OUTPUT` per line, # comments. Raises
    ValueError naming the line for anything else."""
    date, table = "", {}
    for n, line in enumerate(text.splitlines(), 1):
        dated = re.match(r"\s*#\s*date:\s*(\S+)", line)
        date = dated.group(1) if dated and not date else date
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 3:
            raise ValueError(f"line {n}: expected MODEL INPUT OUTPUT (US$ per million tokens), got {line.strip()!r}")
        if words[0] in table:
            raise ValueError(f"line {n}: {words[0]} is listed twice")
        table[words[0]] = Price(_dollars(words[1], f"line {n}"), _dollars(words[2], f"line {n}"))
    return date, table


def parse_price(text: str) -> tuple[str, Price]:
    """`MODEL=IN/OUT` (US$ per million input/output tokens) -> (MODEL, Price). Raises ValueError."""
    name, sep, rates = text.rpartition("=")
    parts = rates.split("/")
    if not sep or not name.strip() or len(parts) != 2:
        raise ValueError(f"{text!r}: expected MODEL=IN/OUT, US dollars per million input and output "
                         "tokens, e.g. gpt-5=1.25/10")
    return name.strip(), Price(_dollars(parts[0], repr(text)), _dollars(parts[1], repr(text)))


def price_of(model: str, base_url: str | None, table: dict[str, Price], given: dict[str, Price]) -> Price | None:
    """What `model` at `base_url` costs: the price given on the command line, else 0 on a local server, else
    the table's (exact name, or the name without a dated-snapshot suffix); None when unknown."""
    if model in given:
        return given[model]
    if base_url and is_local(base_url):
        return Price(0.0, 0.0)
    return table.get(model) or table.get(undated(model))


def is_local(url: str) -> bool:
    """A base URL on this machine: localhost, a loopback address (127.0.0.0/8, ::1)."""
    host = (urlparse(url if "//" in url else "//" + url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def undated(model: str) -> str:
    """The model name without Gemini's models/ prefix and a dated snapshot's suffix (-20250929, -2025-08-07)."""
    return re.sub(r"-(\d{8}|\d{4}-\d{2}-\d{2})$", "", model.removeprefix("models/"))


def parse_models(text: str) -> dict[str, float]:
    """`a,b,c` (equal weights) or `a=0.7,b=0.3` -> {model: weight}. Raises ValueError: an empty name, a model
    twice, a weight that is no number > 0, or weights on some models only."""
    out: dict[str, float] = {}
    weighted = 0
    for item in (p.strip() for p in text.split(",")):
        name, sep, w = item.rpartition("=") if "=" in item else (item, "", "")
        name = name.strip()
        if not name:
            raise ValueError(f"{text!r}: a model without a name (a stray comma or '=')")
        if name in out:
            raise ValueError(f"{text!r}: {name} is given twice")
        try:
            weight = float(w) if sep else 1.0
        except ValueError:
            raise ValueError(f"{text!r}: the weight of {name} is not a number") from None
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"{text!r}: the weight of {name} must be a number > 0")
        out[name] = weight
        weighted += bool(sep)
    if 0 < weighted < len(out):
        raise ValueError(f"{text!r}: give every model a weight (a=0.7,b=0.3) or none (a,b: equal weights)")
    return out


# ----------------------------------------------------------------------------- the choice of a model

class Choice:
    """Per-model statistics (main-role calls, dollars, gain), kept in the checkpoint; `choose` in subclasses."""

    kind = ""

    def __init__(self, names: list[str]):
        if not names:
            raise ValueError("at least one model")
        self.names = list(names)
        self.stats = {m: {"calls": 0, "usd": 0.0, "gain": 0.0} for m in self.names}

    def choose(self, rng: random.Random) -> str:
        raise NotImplementedError

    def update(self, model: str, calls: int, usd: float, gain: float) -> None:
        s = self.stats[model]
        s["calls"] += calls
        s["usd"] += usd
        s["gain"] += gain

    def per_dollar(self, model: str) -> float | None:
        """Improvement per dollar so far (None before any dollar was spent on the model)."""
        s = self.stats[model]
        return s["gain"] / s["usd"] if s["usd"] > 0 else None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "stats": {m: dict(s) for m, s in self.stats.items()}}

    def restore(self, d: dict | None) -> None:
        """The saved statistics of the models still present; a model new to the list starts fresh."""
        for m, s in ((d or {}).get("stats") or {}).items():
            if m in self.stats:
                self.stats[m] = {"calls": int(s["calls"]), "usd": float(s["usd"]), "gain": float(s["gain"])}


class Weighted(Choice):
    """The ensemble: each call draws a model with probability weight / sum of weights."""

    kind = "weights"

    def __init__(self, weights: dict[str, float]):
        super().__init__(list(weights))
        self.weights = [weights[m] for m in self.names]

    def choose(self, rng: random.Random) -> str:
        if len(self.names) == 1:
            return self.names[0]
        return rng.choices(self.names, self.weights)[0]


class CostUCB(Choice):
    """UCB1 over improvement per dollar (the module's docstring has the formula)."""

    kind = "ucb"

    def choose(self, rng: random.Random) -> str:
        if len(self.names) == 1:
            return self.names[0]
        untried = [m for m in self.names if self.stats[m]["calls"] == 0]
        if untried:
            return rng.choice(untried)
        index = self.index()
        top = max(index.values())
        tied = [m for m in self.names if index[m] >= top - 1e-12]
        return tied[0] if len(tied) == 1 else rng.choice(tied)

    def values(self) -> dict[str, float]:
        """v_m for the models called at least once (the module's docstring)."""
        return {m: gain / cost for m, (gain, cost) in self._terms().items()}

    def index(self) -> dict[str, float]:
        """U_m for the models called at least once. v_m / max v_k is taken from the terms each scaled by
        its largest first: gains near the smallest float (hypothesis found 5e-324) would otherwise divide
        to zero under one price scale and not under another, and prices must not change the choice."""
        terms = self._terms()
        top_gain, top_cost = max(g for g, _ in terms.values()), max(c for _, c in terms.values())
        scaled = {m: (g / top_gain) / (c / top_cost) if top_gain > 0 else 0.0 for m, (g, c) in terms.items()}
        best = max(scaled.values())
        n = sum(s["calls"] for s in self.stats.values())
        return {m: (scaled[m] / best if best > 0 else 0.0) + math.sqrt(2 * math.log(n) / s["calls"])
                for m, s in self.stats.items() if s["calls"]}

    def _terms(self) -> dict[str, tuple[float, float]]:
        """v_m's numerator and denominator for each model called at least once."""
        called = {m: s for m, s in self.stats.items() if s["calls"]}
        calls = sum(s["calls"] for s in called.values())
        g_bar = sum(s["gain"] for s in called.values()) / calls if calls else 0.0
        k = PRIOR_CALLS
        paid = [s["usd"] / s["calls"] for s in called.values() if s["usd"] > 0]
        cost = {m: max(s["usd"], FREE_CALL * min(paid) * s["calls"]) for m, s in called.items()} if paid else {}
        c_bar = sum(cost.values()) / calls if calls else 0.0
        if c_bar <= 0:   # every call was free: gain per call
            return {m: (s["gain"] + k * g_bar, s["calls"] + k) for m, s in called.items()}
        return {m: (s["gain"] + k * g_bar, cost[m] + k * c_bar) for m, s in called.items()}


def make_choice(kind: str, weights: dict[str, float]) -> Choice:
    return CostUCB(list(weights)) if kind == "ucb" else Weighted(weights)


# ----------------------------------------------------------------------------- the spend and its cap

class BudgetReached(BaseException):
    """A call not made: it would take the spend past --budget-usd. A BaseException, so that HCM (which
    records an LLM's failures as results) lets it through: the round it cuts short is not recorded."""


class Spend:
    """The ledger of every call's tokens and dollars (thread-safe), the cap, and each island's calls since
    its last generation ended. `save(ledger)` is called after every call (the run keeps spend.json)."""

    def __init__(self, prices: dict[str, Price | None], cap: float | None = None,
                 max_output_tokens: int | None = None, save: Callable[[dict], None] | None = None):
        self.prices, self.cap, self.max_output, self.save = dict(prices), cap, max_output_tokens, save
        self.total = 0.0                 # dollars paid (priced models), every call this run made
        self.models: dict[str, dict] = {}
        self.rounds: list[float] = []    # the cost of each finished round
        self.cut_short: dict = {}        # a round the cap cut short: what it needed, under which cap and limit
        self.refused = ""                # why a call was refused: from then on every call is
        self.reserved = 0.0              # estimates of the calls in flight
        self.pending: dict = {}          # island -> [{"role", "model", "usd"}] since its last generation
        self.note = ""                   # where the prices came from, for the console
        self._round_start = 0.0
        self._lock = threading.Lock()

    @property
    def priced(self) -> bool:
        """Whether any model costs money (a run on local servers alone shows no dollars)."""
        return any(p is not None and (p.input or p.output) for p in self.prices.values())

    def estimate(self, model: str, prompt_chars: int, probe: bool = False) -> float | None:
        price = self.prices.get(model)
        if price is None:
            return None
        m = self.models.get(model) or {}
        per_char = m["input"] / m["chars"] if m.get("chars") and m.get("input") else 1 / CHARS_PER_TOKEN
        output = self.max_output or (PROBE_OUTPUT if probe else int(m.get("longest") or OUTPUT_ESTIMATE))
        return price.cost(math.ceil(prompt_chars * per_char), output)

    def reserve(self, model: str, prompt: str, probe: bool = False) -> float:
        """The call's estimate, now counted as in flight; raises BudgetReached if it would pass the cap."""
        with self._lock:
            est = self.estimate(model, len(prompt), probe) or 0.0
            if self.cap is not None:
                after = self.total + self.reserved + est
                if not self.refused and after > self.cap:
                    self.cut_short = {"needed_usd": self.total - self._round_start + self.reserved + est,
                                      "cap_usd": self.cap, "max_output_tokens": self.max_output}
                    guessed = not self.max_output and not (self.models.get(model) or {}).get("longest")
                    self.refused = (f"dollar budget reached: {usd(self.total)} of {usd(self.cap)} spent, and the next "
                                    f"{model} call (up to about {usd(est)}) would pass it"
                                    + (f" (its output counted at {PROBE_OUTPUT if probe else OUTPUT_ESTIMATE:,} "
                                       "tokens until it has answered: --max-output-tokens bounds it)" if guessed else ""))
                if self.refused:
                    raise BudgetReached(self.refused)
            self.reserved += est
            return est

    def settle(self, model: str, estimate: float, prompt_chars: int, usage: dict, island=None,
               role: str = "main") -> float | None:
        """Record a finished call (failed ones too: what the server counted is paid); returns its dollars."""
        inp, out = int(usage.get("input") or 0), int(usage.get("output") or 0)
        price = self.prices.get(model)
        cost = price.cost(inp, out) if price is not None else None
        with self._lock:
            self.reserved = max(0.0, self.reserved - estimate)
            m = self.models.setdefault(model, {"calls": 0, "input": 0, "output": 0, "chars": 0, "longest": 0,
                                               "usd": None if price is None else 0.0})
            m["calls"] += 1
            m["input"] += inp
            m["output"] += out
            m["chars"] += prompt_chars if inp else 0
            if island is not None:   # a search's call; the probe's one word says nothing of the replies to come
                m["longest"] = max(m["longest"], out)
            if cost is not None:
                m["usd"] = (m["usd"] or 0.0) + cost
                self.total += cost
            if island is not None:
                self.pending.setdefault(island, []).append({"role": role, "model": model, "usd": cost})
            self._save()
        return cost

    def take(self, island) -> list[dict]:
        """The calls island `island` made since the last take (its generation, a crossover's prune)."""
        with self._lock:
            return self.pending.pop(island, [])

    def round_started(self) -> None:
        self.pending.clear()   # a round cut short leaves nothing to the next
        self._round_start = self.total

    def round_finished(self) -> None:
        with self._lock:
            self.rounds.append(self.total - self._round_start)
            self.cut_short = {}
            self._save()

    def forecast(self) -> float:
        """The expected cost of the next round: the mean of the last rounds (0 before the first), or what a
        round cut short by the cap needed, while the cap and --max-output-tokens are those that cut it short
        (the same call would be refused again; under others, it may not be)."""
        recent = self.rounds[-RECENT_ROUNDS:]
        mean = sum(recent) / len(recent) if recent else 0.0
        c = self.cut_short
        same = c and c.get("cap_usd") == self.cap and c.get("max_output_tokens") == self.max_output
        return max(mean, float(c["needed_usd"])) if same else mean

    def stop_reason(self) -> str:
        """Why no round should start now ("" when one may): a refused call, or the cap in reach."""
        if self.cap is None:
            return ""
        if self.refused:
            return self.refused
        ahead = self.forecast()
        if self.total >= self.cap or self.total + ahead > self.cap:
            return (f"dollar budget reached: {usd(self.total)} of {usd(self.cap)} spent"
                    + (f", and a round costs about {usd(ahead)}" if self.total < self.cap else ""))
        return ""

    def to_dict(self) -> dict:
        return {"total_usd": self.total, "models": {k: dict(v) for k, v in self.models.items()},
                "rounds_usd": list(self.rounds), "cut_short": dict(self.cut_short), "cap_usd": self.cap,
                "prices": {k: None if p is None else [p.input, p.output] for k, p in self.prices.items()}}

    def attach(self, save: Callable[[dict], None]) -> None:
        """Keep the ledger with `save` from now on (the run directory's spend.json), starting now."""
        with self._lock:
            self.save = save
            self._save()

    def _save(self) -> None:   # under the lock: the file always holds the newest ledger
        if self.save is not None:
            self.save(self.to_dict())

    def restore(self, d: dict | None) -> None:
        """The ledger of earlier sessions (spend.json); the cap and prices are this session's."""
        d = d or {}
        self.total = float(d.get("total_usd") or 0.0)
        self.models = {k: dict(v) for k, v in (d.get("models") or {}).items()}
        self.rounds = [float(x) for x in d.get("rounds_usd") or []]
        self.cut_short = dict(d.get("cut_short") or {})
        self._round_start = self.total


# ----------------------------------------------------------------------------- the LLM of a role

class Role:
    """The LLM HCM calls for one role: each call goes to one of `clients` ({model: callable}), chosen by
    `choice` with the calling island's seeded generator, within `spend`'s cap. `model`, `last`,
    `last_retries` and `last_usd` describe this thread's latest call (the transcript reads them);
    `usage` counts every call as llm.Client does, and the set-up probes among them."""

    def __init__(self, role: str, clients: dict, choice: Choice, spend: Spend, seed: int = 0):
        self.role, self.clients, self.choice, self.spend, self.seed = role, dict(clients), choice, spend, seed
        self.rngs: dict = {}
        self.usage = dict(calls=0, prompt_tokens=0, completion_tokens=0, reasoning_tokens=0, total_tokens=0,
                          retries=0, failures=0, probes=0)
        self._local, self._lock = threading.local(), threading.Lock()

    def __call__(self, prompt: str) -> str:
        return self._call(None, None, prompt)

    def for_island(self, island: int) -> "_Caller":
        return _Caller(self, island)

    def only(self, model: str) -> "_Caller":
        """`model` alone, outside any island (the probe before a run)."""
        return _Caller(self, None, model)

    def each(self) -> list["_Caller"]:
        return [self.only(m) for m in self.clients]

    @property
    def model(self) -> str:
        return getattr(self._local, "model", None) or ",".join(self.clients)

    @property
    def last(self):
        return getattr(getattr(self._local, "client", None), "last", None)

    @property
    def last_retries(self) -> int:
        return int(getattr(getattr(self._local, "client", None), "last_retries", 0) or 0)

    @property
    def last_usd(self) -> float | None:
        return getattr(self._local, "usd", None)

    def credit(self, island: int, gain: float) -> dict:
        """The end of island `island`'s generation: its main-role calls share `gain` in the statistics; returns
        {"models": {model: main-role calls}, "usd": its calls' dollars (None if a model is unpriced)}."""
        calls = self.spend.take(island)
        mine = [c for c in calls if c["role"] == self.role]
        counts: dict[str, int] = {}
        for c in mine:
            counts[c["model"]] = counts.get(c["model"], 0) + 1
        for m, k in counts.items():
            if m in self.choice.stats:
                self.choice.update(m, k, sum(c["usd"] or 0.0 for c in mine if c["model"] == m),
                                   gain * k / len(mine))
        return {"models": counts,
                "usd": None if any(c["usd"] is None for c in calls) else sum(c["usd"] for c in calls)}

    def state(self) -> dict:
        return {**self.choice.to_dict(), "rngs": {str(k): rng_to_json(r) for k, r in self.rngs.items()}}

    def restore(self, d: dict | None) -> None:
        self.choice.restore(d)
        self.rngs = {int(k): rng_from_json(v) for k, v in ((d or {}).get("rngs") or {}).items()}

    def _rng(self, island) -> random.Random:
        with self._lock:
            if island not in self.rngs:
                self.rngs[island] = random.Random(f"{self.seed}:models:{island}")
            return self.rngs[island]

    def _call(self, island, model: str | None, prompt: str) -> str:
        name = model or (self.choice.choose(self._rng(island)) if len(self.clients) > 1 else next(iter(self.clients)))
        client = self.clients[name]
        estimate = self.spend.reserve(name, prompt, probe=model is not None)   # BudgetReached: nothing sent
        self._local.model, self._local.client, self._local.usd = name, client, None
        failed = True
        try:
            text = client(prompt)
            failed = False
            return text
        finally:
            last = getattr(client, "last", None)
            u = dict(getattr(last, "usage", None) or {})
            self._local.usd = self.spend.settle(name, estimate, len(prompt), u, island, self.role)
            with self._lock:
                self.usage["calls"] += 1
                self.usage["prompt_tokens"] += int(u.get("input") or 0)
                self.usage["completion_tokens"] += int(u.get("output") or 0)
                self.usage["reasoning_tokens"] += int(u.get("reasoning") or 0)
                self.usage["total_tokens"] += int(u.get("total") or 0)
                self.usage["retries"] += int(getattr(client, "last_retries", 0) or 0)
                self.usage["failures"] += failed
                self.usage["probes"] += model is not None   # the set-up's test call of each model


class _Caller:
    """A Role as one island (or the probe of one model) calls it; other attributes are the model's client's."""

    def __init__(self, role: Role, island, model: str | None = None):
        self.role, self.island, self.fixed = role, island, model

    def __call__(self, prompt: str) -> str:
        return self.role._call(self.island, self.fixed, prompt)

    model = property(lambda self: self.fixed or self.role.model)
    last = property(lambda self: self.role.last)
    last_retries = property(lambda self: self.role.last_retries)
    last_usd = property(lambda self: self.role.last_usd)
    usage = property(lambda self: self.role.usage)

    def __getattr__(self, name):   # base_url, provider, origin: the probe's messages name them
        if name in ("role", "island", "fixed"):
            raise AttributeError(name)
        return getattr(self.role.clients[self.fixed or next(iter(self.role.clients))], name)


# ----------------------------------------------------------------------------- helpers

def usd(x: float | None) -> str:
    """Dollars as people read them: $12.34, $0.50, $0.0421, $0, <$0.0001."""
    if x is None:
        return "unpriced"
    if x == 0:
        return "$0"
    if abs(x) >= 1:
        return f"${x:,.2f}"
    if abs(x) < 1e-4:
        return "<$0.0001"
    text = f"{x:.3g}"
    return "$" + (f"{x:.2f}" if len(text.split(".")[-1]) < 2 else text)


def _dollars(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a price (US dollars per million tokens)") from None
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{where}: a price must be a number >= 0, got {text!r}")
    return value


def rng_to_json(rng: random.Random) -> list:
    """A random.Random's state as JSON (checkpoints: the bandit's here, the islands' in run.py)."""
    version, state, gauss = rng.getstate()
    return [version, list(state), gauss]


def rng_from_json(data: list) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng
