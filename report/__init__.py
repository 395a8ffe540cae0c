"""What a run did, for a person to read: report.md with progress.png, and report.html.

    markdown.py    report.md and progress.png, written at the end (and after Ctrl-C)
    html.py        report.html: the whole search on one self-contained page, rewritten after every round
    data.py        the run directory read back for the page
    chart.py       the page's chart, hand-written SVG
    exchanges.py   the page's LLM exchanges, from transcript.jsonl
    cost.py        what the LLM calls cost, for both reports

Everything is drawn from the run directory's files alone, so any run (finished, running or killed) can be
drawn again: `python run.py --report DIR`.
"""
