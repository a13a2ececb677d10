"""Task registry: `load_task(cfg)` builds the task named by `cfg.task.name`."""
