"""relaunch for the frameworks most jobs are written in.

One module per framework, each a thin adapter over relaunch's public API
(``relaunch.preemption``, ``relaunch.init``, ``relaunch.InterruptibleSampler``)
through the framework's own extension points:

- :mod:`relaunch.integrations.lightning`: ``RelaunchCallback`` and
  ``RelaunchLogger`` for PyTorch Lightning.
- :mod:`relaunch.integrations.transformers`: ``RelaunchCallback`` for the
  Hugging Face ``Trainer``.
- :mod:`relaunch.integrations.accelerate`: ``RelaunchTracker`` and
  ``Preemption`` for Hugging Face accelerate.

Each imports its framework when it is imported, never before:
``import relaunch`` imports none of them.

What every integration gives a job under ``relaunch run``: a stop signal
(SIGTERM from Kubernetes or SLURM, Ctrl-C, SIGUSR1 with
``--signals-to-handle``) reaching any process of the job makes every rank
stop at one agreed step, write the framework's own checkpoint of that step,
and exit, so the launcher exits 75 (preempted: requeue) and the relaunched
job resumes exactly there; a progress beat every step for hang detection;
and, with ``--server``, metrics and the config in the job's run.
"""
