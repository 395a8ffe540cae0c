"""What run.py needs around the paper's search: the run's plumbing, one module per concern.

    cli.py                the command line: options, their checks, what a resume may change
    startup.py            setting a run up: device, LLM clients, Ray, evaluator, the reference's s_0
    rundir.py             the run directory: atomic writes, config.json, checkpoints, events
    stopping.py           SIGINT and SIGTERM as a stop request every thread sees, exit codes 130/143
    console.py            the progress lines a run prints
    llm_check.py          the LLM probe before a run, the watch on LLM failures in a row
    models.py             several models per role, prices (prices.txt), the spend and --budget-usd
    transcript.py         transcript.jsonl: every LLM call kept; `python -m driver.transcript DIR [N]`
    replay.py             `run.py --replay DIR`: a recorded search again, replies from its transcript
    evaluations.py        each program evaluated once, stored as it finishes, only verdicts kept
    ranking.py            the confirmed ranking: when a noisy measurement may crown a new best
    prompt_background.py  the prompts' background: the device's measured facts, the contract, the rules
    ray_evaluator.py      --ray: evaluation actors on a Ray cluster, the evaluator's interface

Nothing here is imported by the paper's modules (hcm*.py, momentum.py, crossover.py, llm.py, tasks.py).
"""
