"""One-line switches for code written against other tools: ``ml_logger``
(ml-logger's ``logger``) and ``cycling_utils`` (atomic checkpoint directories
and interruptible samplers), on top of relaunch's own client, Checkpointer
and sampler."""
