"""The chart of report.html (report/chart.py) and progress.png (report/markdown.py): failed candidates in a band of
their own, one momentum lane per island, eps_rel clear of the lane's bottom whatever its value, and a
legend outside the panels."""
from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from report import chart as report_chart
from report import data as report_data
from report import markdown
from test_report_html import make_run


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-9, 0.999), st.floats(0, 1), st.floats(0, 1))
def test_eps_rel_sits_clear_of_the_bottom_and_the_scale_keeps_order(eps, a, b):
    floor = report_chart.momentum_floor(eps)
    at = report_chart.momentum_scale(eps, floor)
    assert 0.099 <= at < 1.0   # a tenth of the lane or more above its bottom (the paper's 0.001: a quarter)
    assert 0.0 <= report_chart.momentum_scale(a, floor) <= 1.0
    if a <= b:
        assert report_chart.momentum_scale(a, floor) <= report_chart.momentum_scale(b, floor)


def _rects(svg: str) -> list[tuple[float, float, float, float]]:
    return [tuple(float(v) for v in m) for m in re.findall(
        r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg)]


def test_failures_have_their_band_and_islands_their_lanes(tmp_path):
    run = report_data.load(make_run(tmp_path / "run", generations=40, islands=3))
    svg = report_chart.svg(run)
    rects = _rects(svg)
    speed = max(rects, key=lambda r: r[3])   # the tallest panel
    band = next(r for r in rects if 'fill="#fbf3f2"' in svg and r[1] > speed[1] + speed[3])
    lanes = [r for r in rects if r[1] > band[1] + band[3]]
    assert len(lanes) == 3
    for upper, lower in zip(lanes, lanes[1:]):
        assert upper[1] + upper[3] < lower[1]   # lanes do not overlap
    failed = [float(y) for y in re.findall(r'<text class="mark f\d" x="[\d.]+" y="([\d.]+)"', svg)]
    assert failed and all(band[1] < y <= band[1] + band[3] for y in failed)
    dots = [float(y) for y in re.findall(r'<circle class="mark i\d" cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert dots and all(speed[1] <= y <= speed[1] + speed[3] for y in dots)
    for k, line in enumerate(re.findall(r'<polyline fill="none" stroke="[^"]+" stroke-width="1.5" points="([^"]+)"',
                                        svg)):
        ys = [float(p.split(",")[1]) for p in line.split()]
        assert all(lanes[k][1] <= y <= lanes[k][1] + lanes[k][3] for y in ys)   # island k in lane k


def test_progress_png_legend_hides_nothing_and_failures_have_their_band(tmp_path):
    events = report_data.load(make_run(tmp_path / "run", generations=30, islands=3)).events
    data = markdown.progress_data(events, 4.0)
    assert set(data["momentum"]) == {0, 1, 2} and len(data["momentum"][0]) == 30
    fig = markdown.progress_figure(data, "synthetic", eps_rel=0.001)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    speed, band, *lanes = fig.axes
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent(renderer))
    assert len(lanes) == 3 and all(lane.get_yscale() == "log" for lane in lanes)
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"incorrect", "crossover", "backtrack", "eps_rel = 0.001", "island 2 best so far"} <= labels
    assert len(band.collections) >= 3 and not any(c.get_offsets().shape[0] and c.get_offsets()[:, 1].max() < 0.5
                                                   and c.get_offsets()[:, 1].min() > 5 for c in speed.collections)
    assert markdown.plot_progress(data, "synthetic", Path(tmp_path / "p.png"), 0.001)


def test_report_md_states_a_zero_target_as_the_default():
    assert markdown.target_text(2.5) == "2.5 ms"
    assert markdown.target_text(0.0) == "0 ms (no --target-speedup: progress counts toward 0 ms)"


def test_both_reports_say_how_many_calls_were_set_up_probes():
    from report.data import calls_text
    assert calls_text({"calls": 38, "probes": 1}) == "38 calls (1 set-up probe)"
    assert calls_text({"calls": 1}) == "1 call"
    assert calls_text({"calls": 2000, "probes": 3}) == "2,000 calls (3 set-up probes)"


def test_the_crossover_probabilities_median_is_the_middle_of_an_even_count():
    actions = [{"action": "backtrack", "weights": {"backtrack": 1.0 - p, "1": p}} for p in (0.032, 0.063, 0.032, 0.063)]
    assert "(median 0.048)" in markdown.weights_summary(actions)   # not the upper middle value, 0.063
