"""What travels between the machines of a farm: the files tasks name and the images rollouts run in."""
