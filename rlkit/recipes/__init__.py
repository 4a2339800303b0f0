"""How rlkit runs verl: the GRPO recipe and its arms rendered to verl overrides (grpo), verl's own check of them (check), and one verl job launched and read back (job)."""
