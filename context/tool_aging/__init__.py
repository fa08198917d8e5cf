"""Tool-result aging: Budget Reduction (`truncate`) and the cascade's policy (`policy`)."""
