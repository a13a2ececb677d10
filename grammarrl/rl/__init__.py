"""The method's parts: the reward (`reward`: its interface and the paper's bidirectional reward;
`rewards`: the reference passes it is computed from), RLOO advantages, group rollouts and the σ
calibration."""
