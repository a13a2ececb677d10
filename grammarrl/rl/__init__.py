"""The method's parts: the bidirectional reward, RLOO advantages, group rollouts and the σ calibration."""
