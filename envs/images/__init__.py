"""Container images built offline: the debootstrap base image, per-instance images, names, disk budget."""
