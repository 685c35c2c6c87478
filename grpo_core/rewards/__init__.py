"""Rewards and their data: the reward scorer GRPO calls (answer checker, ORM, PRM), the reward-model
heads and losses, step splitting and labels, labelled samples, the replay buffer and the rollout log."""
