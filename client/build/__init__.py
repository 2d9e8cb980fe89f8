"""The build job (``cachesvc-client build``): build and publish the packages that cover the top of the fleet's
demand for a model, each through the one call, so a fleet's processes find their shapes built.

    example = build.load("app.model:build")                       # target.py: the model and its example call
    outcome = build.run(example, build.Job(name="ranker"), client)  # job.py: example, demand, plan, packages
    print("\\n".join(outcome.lines())); sys.exit(0 if outcome.ok else 1)

    target.py   TARGET (``module:function`` or ``file.py:function``) -> the model and its example call
    plan.py     the fleet's demand -> the packages to build: exact shapes, else ranges (pure: the rule)
    job.py      the steps: the example built, the demand read, the plan built busiest first within a budget
    outcome.py  what the job did, as lines and as one JSON document

The door is ``run`` (with ``Job`` and ``load``); the rule is ``plan.plan`` (not a name of the door: the
function would hide its module). It calls the one call (one_call's door) and ``CacheClient``'s public
methods; the CLI (cli/commands.py) imports it when the command runs.
"""
from __future__ import annotations

from .job import Job, JobError, run
from .outcome import Outcome
from .plan import Plan
from .target import Example, TargetError, load

__all__ = ["Example", "Job", "JobError", "Outcome", "Plan", "TargetError", "load", "run"]
