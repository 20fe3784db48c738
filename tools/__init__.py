"""What measures the model rather than trains it: python -m tools.bench (speed), python -m tools.study
(quality)."""
