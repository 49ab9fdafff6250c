"""Making traces: from anonymized logs (`logs/`), from a fitted statistical model (`generate`, `fit`),
and judging how alike two traces are (`compare`)."""
