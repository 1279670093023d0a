"""Harbor task directories: the dataset, images, environment, reward contract and verifier."""
