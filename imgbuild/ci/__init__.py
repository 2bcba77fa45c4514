"""CI work over many recipes: rebuild (exactly what changed, in waves of parents before children), fanout (the
plan as CI matrices and child pipelines, one runner per image), bump (bases along `base.follow`), reproduce (build
twice, compare)."""
