"""`zeroscale doctor`: check an installation in a cluster and say in plain words what is wrong."""
