"""Commands around the library: the rlkit CLI, the notebook runner, the offline-node bundle, doctor and the verl compatibility run."""
