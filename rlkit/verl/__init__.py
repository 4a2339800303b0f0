"""What rlkit reads from verl: its configuration (config) and its console text (logs). Only the patches import verl itself."""
