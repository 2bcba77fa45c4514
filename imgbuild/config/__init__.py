"""Settings: one typed tree (settings) read by precedence, flag > environment > user file > site file, and the site
config's sections (site: run, reap, slurm, fleet)."""
